//! Conditions as Kubernetes tools read them: one per type, its
//! `lastTransitionTime` moved only when its status changes (so a status
//! written every pass does not look like a flap).
use crate::crd::Condition;

impl Condition {
    pub fn new(type_: &str, ok: bool, reason: &str, message: impl Into<String>) -> Condition {
        Condition {
            type_: type_.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: None,
            observed_generation: None,
        }
    }

    pub fn generation(mut self, generation: Option<i64>) -> Condition {
        self.observed_generation = generation;
        self
    }

    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
}

/// `prev` with `new` in place of its type: the previous transition time kept
/// when the status is unchanged, `now` otherwise. Other types are kept.
pub fn set(prev: &[Condition], mut new: Condition, now: &str) -> Vec<Condition> {
    let old = prev.iter().find(|c| c.type_ == new.type_);
    new.last_transition_time = match old {
        Some(o) if o.status == new.status => o.last_transition_time.clone().or_else(|| Some(now.into())),
        _ => Some(now.into()),
    };
    let mut out: Vec<Condition> = prev.iter().filter(|c| c.type_ != new.type_).cloned().collect();
    out.push(new);
    out
}

/// The condition of that type, if any.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let a = set(&[], Condition::new("Ready", false, "Filling", "0 idle"), "t1");
        assert_eq!(a[0].last_transition_time.as_deref(), Some("t1"));
        let b = set(&a, Condition::new("Ready", false, "Filling", "1 idle"), "t2");
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].last_transition_time.as_deref(), b[0].message.as_str()), (Some("t1"), "1 idle"));
        let c = set(&b, Condition::new("Ready", true, "Warm", "2 idle"), "t3");
        assert_eq!(c[0].last_transition_time.as_deref(), Some("t3"));
    }

    #[test]
    fn other_types_are_kept() {
        let a = set(&[], Condition::new("Lost", true, "Gone", ""), "t1");
        let b = set(&a, Condition::new("Ready", true, "Warm", ""), "t2");
        assert_eq!(b.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(), ["Lost", "Ready"]);
        assert!(find(&b, "Ready").is_some_and(Condition::is_true));
    }
}
