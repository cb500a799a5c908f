//! ember's default seccomp policy, in the spirit of Docker's default profile: a
//! deny-list of syscalls a sandboxed workload has no business making (mounts,
//! namespaces, kernel modules, keyrings, bpf, clock and reboot), compiled to BPF
//! by seccompiler. Allow-by-default keeps ordinary software working; the dangerous
//! surface is closed and the capability set is small on top of it.
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

pub use seccompiler::BpfProgram;

#[derive(Debug, thiserror::Error)]
#[error("building seccomp filter: {0}")]
pub struct SeccompError(String);

/// Syscalls that fail with EPERM whatever their arguments.
const DENIED: &[i64] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_userfaultfd,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_mount_setattr,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_lookup_dcookie,
    libc::SYS_uselib,
    libc::SYS_ustat,
    libc::SYS_sysfs,
    libc::SYS_vhangup,
    libc::SYS_kcmp,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// Namespace flags `clone` may not carry (each one its own rule: the rules of a
/// syscall are OR-ed, the conditions of a rule AND-ed).
const CLONE_NS_FLAGS: &[i32] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWCGROUP,
];

fn err(e: impl std::fmt::Display) -> SeccompError {
    SeccompError(e.to_string())
}

/// The default filters, in the order they are loaded.
pub fn default_filters() -> Result<Vec<BpfProgram>, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|&s| (s, vec![])).collect();
    let mut clone_rules = Vec::new();
    for &flag in CLONE_NS_FLAGS {
        let c = SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag as u64), flag as u64)
            .map_err(err)?;
        clone_rules.push(SeccompRule::new(vec![c]).map_err(err)?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    // personality: only the harmless personas (as Docker allows).
    let mut conds = Vec::new();
    for v in [0u64, 0x0008, 0x20000, 0x20008, 0xffff_ffff] {
        conds.push(SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, v).map_err(err)?);
    }
    rules.insert(libc::SYS_personality, vec![SeccompRule::new(conds).map_err(err)?]);
    let deny = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch())
        .map_err(err)?;

    // clone3 passes its flags in memory, where BPF cannot look: answer ENOSYS so
    // libc falls back to clone, whose flags the filter above can check.
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch(),
    )
    .map_err(err)?;
    Ok(vec![deny.try_into().map_err(err)?, clone3.try_into().map_err(err)?])
}

#[cfg(target_arch = "x86_64")]
fn arch() -> TargetArch {
    TargetArch::x86_64
}

#[cfg(target_arch = "aarch64")]
fn arch() -> TargetArch {
    TargetArch::aarch64
}

/// A short description of the loaded profile, for the enforced-boundary report.
pub const PROFILE_NAME: &str = "ember-default (deny-list, EPERM; clone3 ENOSYS)";

#[cfg(test)]
mod tests {
    #[test]
    fn filters_compile() {
        let f = super::default_filters().unwrap();
        assert_eq!(f.len(), 2);
        assert!(f[0].len() > super::DENIED.len());
    }
}
