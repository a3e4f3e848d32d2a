//! Terminal rendering, wrapped to 80 columns.

use std::fmt::Write;

use super::Report;
use super::chains::{Severity, fmt_ns};

const WIDTH: usize = 80;

/// Wraps `text` with `first` before the first line and `rest` before the others.
fn wrap(out: &mut String, first: &str, rest: &str, text: &str) {
    let mut line = first.to_string();
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && line.chars().count() + 1 + word.chars().count() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = rest.to_string();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
}

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Ingero stall report: {}", r.target);
    wrap(&mut o, "", "  ", &format!("{} → {}", r.from, r.to));
    wrap(&mut o, "Nodes: ", "  ", &r.nodes.join(", "));
    if !r.jobs.is_empty() {
        wrap(&mut o, "Job: ", "  ", &r.jobs.join(", "));
    }
    wrap(
        &mut o,
        "Processes: ",
        "  ",
        &format!(
            "{} (pid {})",
            r.processes.join(", "),
            r.pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
        ),
    );
    let s = &r.summary;
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Host stall {:.0}% (run-queue {:.0}%, off-CPU {:.0}%), IO {:.0}%, {} windows",
        s.stall_share * 100.0,
        s.runq_share * 100.0,
        s.offcpu_share * 100.0,
        s.io_share * 100.0,
        s.windows
    );
    match (s.sync_p99_baseline_ns, s.sync_p99_worst_ns) {
        (Some(b), Some(w)) => {
            let _ = writeln!(o, "Sync p99 {} calm → {} worst", fmt_ns(b), fmt_ns(w));
        }
        (Some(b), None) => {
            let _ = writeln!(o, "Sync p99 {} (no slower in the stalled windows)", fmt_ns(b));
        }
        _ => {}
    }
    for st in &r.straggler {
        let flag = if st.flagged { "FLAGGED straggler" } else { "deviating" };
        let sig = st.signals.iter().map(|d| d.text.clone()).collect::<Vec<_>>().join("; ");
        wrap(&mut o, "", "  ", &format!("{} in job {}: {flag}, score {:.1}: {sig}", st.node, st.job, st.score));
    }
    let _ = writeln!(o, "\nCausal chains");
    let _ = writeln!(o, "{}", "━".repeat(WIDTH));
    if r.chains.is_empty() {
        wrap(
            &mut o,
            "",
            "",
            "No stall found: host stall, IO, memory and collective waits are all within normal ranges.",
        );
    }
    for c in &r.chains {
        let sev = match c.severity {
            Severity::High => "HIGH",
            Severity::Medium => "MEDIUM",
            Severity::Low => "LOW",
        };
        wrap(&mut o, "", "  ", &format!("{sev} {}", c.title));
        if let Some(x) = c.explains {
            let _ = writeln!(o, "  Explains: {} of the time", super::chains::pct(x));
        }
        for x in &c.root_cause {
            wrap(&mut o, "  Root: ", "        ", x);
        }
        for x in &c.effect {
            wrap(&mut o, "  Effect: ", "          ", x);
        }
        for x in &c.contributing {
            wrap(&mut o, "  Contributing: ", "                ", x);
        }
        for x in &c.fixes {
            wrap(&mut o, "  Fix: ", "       ", x);
        }
        let _ = writeln!(o);
    }
    reference(&mut o, r);
    o
}

/// The source product's stored diagnoses, one line per distinct one.
fn reference(o: &mut String, r: &Report) {
    if r.reference.is_empty() {
        return;
    }
    let _ = writeln!(o, "Diagnoses stored in the imported trace (Ingero Go)");
    let _ = writeln!(o, "{}", "━".repeat(WIDTH));
    for v in &r.reference {
        let times = if v.count > 1 { format!(" (×{}, {} → {})", v.count, v.first, v.last) } else { String::new() };
        wrap(o, "", "  ", &format!("{} — {}{times}", v.verdict.to_uppercase(), v.their_summary));
        wrap(o, "  Why: ", "       ", &v.why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_80_columns() {
        let mut o = String::new();
        wrap(&mut o, "  Fix: ", "       ", &"word ".repeat(60));
        assert!(o.lines().all(|l| l.chars().count() <= WIDTH), "{o}");
        assert!(o.lines().count() > 3);
    }
}
