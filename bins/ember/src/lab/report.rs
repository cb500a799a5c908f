//! The report every lab run writes: before/after tables, the invariants its
//! argument rests on, its charts, and its raw figures. `report.json` is the
//! machine-readable copy (CI reads the invariants from it); `report.md` is the
//! same content for people; `ember lab report DIR` joins runs into one page.
use super::Scale;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};

/// A report.json larger than this is not one a lab wrote.
const MAX_REPORT: u64 = 16 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabReport {
    pub lab: u32,
    pub name: String,
    pub title: String,
    pub scale: Scale,
    /// Unix seconds at the start of the run.
    pub started: u64,
    pub tables: Vec<Table>,
    pub invariants: Vec<Invariant>,
    /// SVG files in the run's folder.
    pub charts: Vec<String>,
    /// Findings worth reading beside the tables (one sentence each).
    pub notes: Vec<String>,
    /// The lab's own figures, as measured.
    pub data: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Table {
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// A property the lab's argument needs, checked on this run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Invariant {
    pub name: String,
    pub holds: bool,
    pub detail: String,
}

impl Table {
    pub fn new(title: &str, columns: &[&str]) -> Table {
        Table { title: title.into(), columns: columns.iter().map(|c| c.to_string()).collect(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn markdown(&self, out: &mut String) {
        let _ = writeln!(out, "### {}\n", self.title);
        let _ = writeln!(out, "| {} |", self.columns.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(self.columns.len()));
        for r in &self.rows {
            let _ = writeln!(out, "| {} |", r.join(" | "));
        }
        out.push('\n');
    }

    fn text(&self, out: &mut String) {
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| {
                let cells = self.rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count());
                cells.chain([self.columns[i].chars().count()]).max().unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
            padded.join("  ").trim_end().to_string()
        };
        let _ = writeln!(out, "\n{}", self.title);
        let _ = writeln!(out, "  {}", line(&self.columns));
        for r in &self.rows {
            let _ = writeln!(out, "  {}", line(r));
        }
    }
}

impl LabReport {
    pub fn new(lab: &super::Lab, scale: Scale) -> LabReport {
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        LabReport {
            lab: lab.n,
            name: lab.name.into(),
            title: lab.title.into(),
            scale,
            started,
            tables: Vec::new(),
            invariants: Vec::new(),
            charts: Vec::new(),
            notes: Vec::new(),
            data: serde_json::Value::Null,
        }
    }

    pub fn check(&mut self, name: &str, holds: bool, detail: impl Into<String>) {
        self.invariants.push(Invariant { name: name.into(), holds, detail: detail.into() });
    }

    /// Writes an SVG chart into `dir` and lists it.
    pub fn chart(&mut self, dir: &Path, file: &str, svg: String) -> anyhow::Result<()> {
        let p = dir.join(file);
        std::fs::write(&p, svg).with_context(|| format!("writing {}", p.display()))?;
        self.charts.push(file.into());
        Ok(())
    }

    /// What the terminal shows: tables, invariants, notes.
    pub fn to_text(&self) -> String {
        let mut out = format!("lab {}: {} ({:?} scale)\n", self.lab, self.title, self.scale);
        for t in &self.tables {
            t.text(&mut out);
        }
        out.push_str("\ninvariants\n");
        for i in &self.invariants {
            let _ = writeln!(out, "  [{}] {}: {}", if i.holds { "ok" } else { "FAILED" }, i.name, i.detail);
        }
        for n in &self.notes {
            let _ = writeln!(out, "  note: {n}");
        }
        out
    }

    /// The Markdown of one run; `prefix` is the path from the page to the run's folder.
    fn markdown(&self, prefix: &str, out: &mut String) {
        let _ =
            writeln!(out, "## Lab {}: {} ({:?} scale, started {})\n", self.lab, self.title, self.scale, self.started);
        for t in &self.tables {
            t.markdown(out);
        }
        out.push_str("### Invariants\n\n");
        for i in &self.invariants {
            let _ = writeln!(out, "- {} **{}**: {}", if i.holds { "✔" } else { "✘" }, i.name, i.detail);
        }
        out.push('\n');
        for n in &self.notes {
            let _ = writeln!(out, "> {n}\n");
        }
        for c in &self.charts {
            let _ = writeln!(out, "![{c}]({prefix}{c})\n");
        }
    }

    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_vec_pretty(self).context("encoding report.json")?;
        let p = dir.join("report.json");
        std::fs::write(&p, json).with_context(|| format!("writing {}", p.display()))?;
        let mut md = String::new();
        self.markdown("", &mut md);
        let p = dir.join("report.md");
        std::fs::write(&p, md).with_context(|| format!("writing {}", p.display()))
    }

    pub fn read(path: &Path) -> anyhow::Result<LabReport> {
        let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut buf = Vec::new();
        f.take(MAX_REPORT + 1).read_to_end(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        anyhow::ensure!(buf.len() as u64 <= MAX_REPORT, "{} is over {MAX_REPORT} bytes", path.display());
        serde_json::from_slice(&buf).with_context(|| format!("parsing {}", path.display()))
    }
}

/// Every run under `dir` (`dir` itself or its direct subfolders holding a
/// report.json), by lab then start time, as one Markdown page `dir/index.md`.
pub fn render_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let mut runs = Vec::new();
    if dir.join("report.json").is_file() {
        runs.push((String::new(), LabReport::read(&dir.join("report.json"))?));
    }
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for e in entries {
        let e = e.with_context(|| format!("reading {}", dir.display()))?;
        let p = e.path().join("report.json");
        if e.file_type().is_ok_and(|t| t.is_dir()) && p.is_file() {
            runs.push((format!("{}/", e.file_name().to_string_lossy()), LabReport::read(&p)?));
        }
    }
    anyhow::ensure!(!runs.is_empty(), "no lab runs (report.json) in {} or its subfolders", dir.display());
    runs.sort_by_key(|(_, r)| (r.lab, r.started));
    let mut page = String::from("# ember labs\n\n| lab | scale | invariants |\n|---|---|---|\n");
    for (_, r) in &runs {
        let held = r.invariants.iter().filter(|i| i.holds).count();
        let _ = writeln!(page, "| {} {} | {:?} | {held}/{} hold |", r.lab, r.title, r.scale, r.invariants.len());
    }
    page.push('\n');
    for (prefix, r) in &runs {
        r.markdown(prefix, &mut page);
    }
    let out = dir.join("index.md");
    std::fs::write(&out, page).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

/// Milliseconds with one decimal, or "-" when nothing was measured.
pub fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}
