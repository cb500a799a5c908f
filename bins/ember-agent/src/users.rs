//! /etc/passwd and /etc/group, parsed by hand.
//!
//! The agent is statically linked against glibc, where getpwnam and friends
//! would try to dlopen NSS modules; so it never calls them. The files are
//! small and re-read on each use, so edits made inside the sandbox are seen.
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

/// The user and group databases of the sandbox.
#[derive(Clone, Debug, Default)]
pub struct UserDb {
    pub users: Vec<User>,
    pub groups: Vec<Group>,
}

impl UserDb {
    /// Reads /etc/passwd and /etc/group; a missing or unreadable file is an
    /// empty database (minimal images often have neither).
    pub fn load() -> UserDb {
        UserDb::load_from(Path::new("/etc/passwd"), Path::new("/etc/group"))
    }

    pub fn load_from(passwd: &Path, group: &Path) -> UserDb {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        UserDb { users: parse_passwd(&read(passwd)), groups: parse_group(&read(group)) }
    }

    pub fn user_by_uid(&self, uid: u32) -> Option<&User> {
        self.users.iter().find(|u| u.uid == uid)
    }

    pub fn group_by_gid(&self, gid: u32) -> Option<&Group> {
        self.groups.iter().find(|g| g.gid == gid)
    }

    /// A uid from a user name or a numeric string.
    pub fn resolve_user(&self, name: &str) -> Option<u32> {
        self.users.iter().find(|u| u.name == name).map(|u| u.uid).or_else(|| name.parse().ok())
    }

    /// A gid from a group name or a numeric string.
    pub fn resolve_group(&self, name: &str) -> Option<u32> {
        self.groups.iter().find(|g| g.name == name).map(|g| g.gid).or_else(|| name.parse().ok())
    }

    /// The owner name shown in FileInfo: the user name, else the number.
    pub fn user_name(&self, uid: u32) -> String {
        self.user_by_uid(uid).map_or_else(|| uid.to_string(), |u| u.name.clone())
    }

    pub fn group_name(&self, gid: u32) -> String {
        self.group_by_gid(gid).map_or_else(|| gid.to_string(), |g| g.name.clone())
    }

    /// Supplementary groups of a user: its primary gid plus every group that
    /// lists it as a member.
    pub fn groups_of(&self, user: Option<&User>, primary: u32) -> Vec<u32> {
        let mut gids = vec![primary];
        if let Some(user) = user {
            for g in &self.groups {
                if g.members.contains(&user.name) && !gids.contains(&g.gid) {
                    gids.push(g.gid);
                }
            }
        }
        gids
    }
}

fn records(text: &str) -> impl Iterator<Item = Vec<&str>> {
    text.lines().map(str::trim_end).filter(|l| !l.is_empty() && !l.starts_with('#')).map(|l| l.split(':').collect())
}

fn parse_passwd(text: &str) -> Vec<User> {
    records(text)
        .filter(|f| f.len() >= 6)
        .filter_map(|f| {
            Some(User {
                name: f[0].to_string(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
                home: PathBuf::from(f[5]),
            })
        })
        .collect()
}

fn parse_group(text: &str) -> Vec<Group> {
    records(text)
        .filter(|f| f.len() >= 3)
        .filter_map(|f| {
            let members = f
                .get(3)
                .map_or_else(Vec::new, |m| m.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect());
            Some(Group { name: f[0].to_string(), gid: f[2].parse().ok()?, members })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n# comment\nbad line\n\
                          sandbox:x:1000:1000::/home/sandbox:/bin/sh\nnobody:x:65534:65534:n:/nonexistent:/usr/sbin/nologin\n";
    const GROUP: &str = "root:x:0:\nsandbox:x:1000:\ndocker:x:999:sandbox,other\nnogroup:x:65534:\n";

    fn db() -> UserDb {
        UserDb { users: parse_passwd(PASSWD), groups: parse_group(GROUP) }
    }

    #[test]
    fn parses_users_and_skips_junk() {
        let db = db();
        assert_eq!(db.users.len(), 3);
        let u = db.user_by_uid(1000).unwrap();
        assert_eq!((u.name.as_str(), u.gid, u.home.as_path()), ("sandbox", 1000, Path::new("/home/sandbox")));
    }

    #[test]
    fn names_and_numbers() {
        let db = db();
        assert_eq!(db.user_name(0), "root");
        assert_eq!(db.user_name(4242), "4242");
        assert_eq!(db.group_name(999), "docker");
        assert_eq!(db.resolve_user("sandbox"), Some(1000));
        assert_eq!(db.resolve_user("77"), Some(77));
        assert_eq!(db.resolve_user("ghost"), None);
        assert_eq!(db.resolve_group("nogroup"), Some(65534));
    }

    #[test]
    fn supplementary_groups() {
        let db = db();
        let u = db.user_by_uid(1000);
        assert_eq!(db.groups_of(u, 1000), vec![1000, 999]);
        assert_eq!(db.groups_of(None, 5), vec![5]);
    }
}
