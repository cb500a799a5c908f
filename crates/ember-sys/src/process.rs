//! Process-control wrappers used by the in-sandbox agent (owned by the agent work).
