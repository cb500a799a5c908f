//! `--help` complete and consistent: the walk runs `ember <path> -h` for every
//! subcommand clap lists (recursively), and fails on a subcommand or an
//! argument without a description (a bare `[default: ..]` or `[env: ..]` is
//! not one), on a paragraph printed twice in a long `--help`, on an `rm` (or
//! `task cancel`) that accepts no ids, on a flag naming a unit (`--size-mb`:
//! the unit goes in the value) or spelled twice (`--exec-env`), on a flag
//! taking another kind of value in another command, and on `--url` /
//! `--api-key` offered by a command that never calls the API; and `ember
//! sandbox ls -q` prints ids only.
//! The walk needs no daemon: nothing in it reaches the API.
mod common;

use std::process::{Command, Output};

fn ember(args: &[&str]) -> Output {
    // An address nothing listens on: a command that got past clap fails with 1, a usage error is 2.
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .env("EMBER_URL", "http://127.0.0.1:9")
        .output()
        .expect("ember runs")
}

fn help(path: &[String], flag: &str) -> String {
    let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
    args.push(flag);
    let out = ember(&args);
    assert!(out.status.success(), "ember {} {flag}: {out:?}", path.join(" "));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One entry of a help section: its first line's head and its description
/// (the rest of that line and its indented continuation lines).
struct Entry {
    section: String,
    head: String,
    text: String,
}

fn entries(out: &str) -> Vec<Entry> {
    let (mut section, mut all) = (String::new(), Vec::<Entry>::new());
    for line in out.lines() {
        let indent = line.len() - line.trim_start().len();
        if indent == 0 && line.ends_with(':') {
            section = line.trim_end_matches(':').to_string();
        } else if section.is_empty() || line.trim().is_empty() {
            continue;
        } else if (2..=6).contains(&indent) {
            let body = line.trim_start();
            let (head, text) = body.split_once("  ").unwrap_or((body, ""));
            all.push(Entry { section: section.clone(), head: head.to_string(), text: text.trim().to_string() });
        } else if let Some(e) = all.last_mut() {
            e.text.push(' ');
            e.text.push_str(line.trim());
        }
    }
    all
}

/// The description without clap's bracketed notes.
fn described(text: &str) -> bool {
    let mut t = text.to_string();
    while let Some(start) = t.find(" [").or_else(|| t.starts_with('[').then_some(0)) {
        let Some(end) = t[start..].find(']') else { break };
        t.replace_range(start..start + end + 1, "");
    }
    !t.trim().is_empty()
}

/// Every visible flag seen by the walk: its name, its value placeholder and where.
#[derive(Default)]
struct Flags(Vec<(String, String, String)>);

/// `-q, --quiet` / `--env <K=V>` / `--url <URL>` → ("--env", "<K=V>").
fn flag(head: &str) -> Option<(String, String)> {
    let long = head.split(", ").last()?.trim();
    let (name, value) = long.split_once(' ').unwrap_or((long, ""));
    name.starts_with("--").then(|| (name.to_string(), value.to_string()))
}

/// Commands that never call the API: `--url` / `--api-key` are not offered there.
fn offers_no(path: &[String]) -> &'static [&'static str] {
    match path.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["serve", ..] => &["--url"],
        ["uninstall", ..] | ["cluster", ..] | ["chaos", ..] | ["bench", "snapshot"] => &["--url", "--api-key"],
        _ => &[],
    }
}

/// One name per idea: a unit is written in the value (`--size 512Mi`,
/// `--timeout 30s`), never in the flag's name; the old spellings are hidden.
fn unit_in_name(name: &str) -> bool {
    ["-mb", "-mib", "-ms", "-secs", "-seconds", "-bytes"].iter().any(|u| name.ends_with(u))
}

fn walk(path: Vec<String>, problems: &mut Vec<String>, seen: &mut usize, flags: &mut Flags) {
    *seen += 1;
    let name = format!("ember {}", path.join(" "));
    let mut subs = Vec::new();
    for e in entries(&help(&path, "-h")) {
        if e.head.starts_with("-h, --help") || e.head.starts_with("-V, --version") || e.head == "help" {
            continue;
        }
        if let Some((f, value)) = flag(&e.head) {
            if offers_no(&path).contains(&f.as_str()) {
                problems.push(format!("{name}: offers {f}, but never calls the API"));
            }
            if unit_in_name(&f) || f == "--exec-env" {
                problems.push(format!("{name}: {f} names a unit or a second spelling; one name per idea"));
            }
            flags.0.push((f, value, name.clone()));
        }
        if e.section == "Commands" {
            subs.push(e.head.split_whitespace().next().unwrap_or_default().trim_end_matches(',').to_string());
        }
        if !described(&e.text) {
            problems.push(format!("{name}: {} {:?} has no description", e.section, e.head));
        }
    }
    let long = help(&path, "--help");
    let paragraphs: Vec<&str> = long.split("\n\n").map(str::trim).filter(|p| p.len() > 40).collect();
    for (i, p) in paragraphs.iter().enumerate() {
        if paragraphs[..i].contains(p) {
            problems.push(format!("{name} --help repeats a paragraph: {p:?}"));
        }
    }
    if matches!(path.last().map(String::as_str), Some("rm" | "cancel")) {
        let bare: Vec<&str> = path.iter().map(String::as_str).collect();
        let code = ember(&bare).status.code();
        if code != Some(2) {
            problems.push(format!("{name} without ids is not a usage error (exit {code:?})"));
        }
    }
    for s in subs {
        let mut p = path.clone();
        p.push(s);
        walk(p, problems, seen, flags);
    }
}

/// Flags spelled the same that mean two things, and why that is right.
const TWO_MEANINGS: [(&str, &str); 1] = [(
    "--workspace",
    "a mount (NAME[:/PATH][:ro]) where one is mounted, a workspace's name where snapshots are listed",
)];

/// A flag spelled the same in two commands takes the same kind of value.
fn same_value_everywhere(flags: &Flags, problems: &mut Vec<String>) {
    let mut by_name: std::collections::BTreeMap<&str, Vec<(&str, &str)>> = Default::default();
    for (f, value, cmd) in flags.0.iter().filter(|(f, ..)| TWO_MEANINGS.iter().all(|(t, _)| t != f)) {
        by_name.entry(f).or_default().push((value, cmd));
    }
    for (f, uses) in by_name {
        let (first, at) = uses[0];
        if let Some((other, cmd)) = uses.iter().find(|(v, _)| *v != first) {
            problems.push(format!("{f} takes {first:?} in `{at}` but {other:?} in `{cmd}`"));
        }
    }
}

#[test]
fn every_subcommand_and_argument_is_described() {
    let (mut problems, mut seen, mut flags) = (Vec::new(), 0, Flags::default());
    walk(Vec::new(), &mut problems, &mut seen, &mut flags);
    same_value_everywhere(&flags, &mut problems);
    assert!(seen > 50, "the walk found only {seen} commands: the help parser is broken");
    assert!(flags.0.iter().any(|(f, ..)| f == "--url"), "the walk saw no --url: the flag parser is broken");
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn the_old_spellings_still_parse() {
    // Hidden, not gone: each is past clap (exit 1: no daemon at the address), not a usage error (2).
    for args in [
        &["exec", "x", "--exec-env", "A=1", "--", "true"][..],
        &["exec", "x", "--env", "A=1", "--", "true"],
        &["run", "--exec-env", "A=1", "--", "true"],
        &["serve", "--url", "http://127.0.0.1:9", "--help"],
    ] {
        let code = ember(args).status.code();
        assert!(code == Some(1) || (args.contains(&"--help") && code == Some(0)), "ember {args:?}: exit {code:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_ls_q_prints_the_ids_only() {
    let d = common::Daemon::start();
    let mut ids = vec![d.create(|_| {}).await.id, d.create(|_| {}).await.id];
    let out = ember(&["--url", &d.url, "sandbox", "ls", "-q"]);
    assert!(out.status.success(), "{out:?}");
    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    got.sort();
    ids.sort();
    assert_eq!(got, ids);
}

#[test]
fn the_help_parser_sees_an_undescribed_argument() {
    let out = "Usage: x\n\nArguments:\n  <ID>\n\nOptions:\n      --data-dir <D>\n          [default: /x]\n      --ok <V>\n          Said. [default: 1]\n";
    let bad: Vec<String> = entries(out).into_iter().filter(|e| !described(&e.text)).map(|e| e.head).collect();
    assert_eq!(bad, vec!["<ID>".to_string(), "--data-dir <D>".to_string()]);
}
