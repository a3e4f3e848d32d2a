// SPDX-License-Identifier: Apache-2.0
//! Terminal rendering, wrapped to 80 columns.

use std::fmt::Write;

use super::Report;
use super::blocked::BlockedSite;
use super::chains::{Severity, fmt_ns};
use super::data::OpStat;

const WIDTH: usize = 80;

/// Wraps `text` with `first` before the first line and `rest` before the others.
fn wrap(out: &mut String, first: &str, rest: &str, text: &str) {
    let mut line = first.to_string();
    let mut empty = true;
    let fresh = WIDTH.saturating_sub(rest.chars().count());
    for word in text.split_whitespace() {
        let mut word = word;
        loop {
            let (len, gap) = (line.chars().count(), usize::from(!empty));
            let n = word.chars().count();
            if len + gap + n <= WIDTH {
                if !empty {
                    line.push(' ');
                }
                line.push_str(word);
                empty = false;
                break;
            }
            // A word that fits a fresh line goes there; one longer than any
            // line (a qualified Python name, a path) fills this one and goes on.
            let room = WIDTH.saturating_sub(len + gap);
            if !empty && (n <= fresh || room < 12) {
                out.push_str(&line);
                out.push('\n');
                line = rest.to_string();
                empty = true;
                continue;
            }
            let (head, tail) = split_word(word, room.max(1));
            if !empty {
                line.push(' ');
            }
            line.push_str(head);
            out.push_str(&line);
            out.push('\n');
            line = rest.to_string();
            empty = true;
            word = tail;
        }
    }
    out.push_str(&line);
    out.push('\n');
}

/// `word` cut to at most `room` characters: after its last `.`, `/` or `:`
/// (a name's or a path's parts) that leaves at least half the room filled,
/// else its last `_` or `,`, else at `room`.
fn split_word(word: &str, room: usize) -> (&str, &str) {
    let cut = word.char_indices().nth(room).map_or(word.len(), |(i, _)| i);
    let after = |set: &[char]| {
        word[..cut]
            .char_indices()
            .filter(|(_, c)| set.contains(c))
            .map(|(i, c)| i + c.len_utf8())
            .rfind(|&i| word[..i].chars().count() * 2 >= room)
    };
    word.split_at(after(&['.', '/', ':']).or_else(|| after(&['_', ','])).unwrap_or(cut))
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
            "{} (pid {}){}",
            r.processes.join(", "),
            r.pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "),
            super::renamed(r)
        ),
    );
    let s = &r.summary;
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Host stall {:.0}% (run-queue {:.0}%, off-CPU {:.0}%), IO {:.0}%{}, {} windows",
        s.stall_share * 100.0,
        s.runq_share * 100.0,
        s.offcpu_share * 100.0,
        s.io_share * 100.0,
        if s.io_share > 1.0 { " (overlapping requests)" } else { "" },
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
        let _ = writeln!(o);
    }
    chains(&mut o, r);
    steps(&mut o, r);
    calls_table(&mut o, &r.ops);
    if !r.call_sites.is_empty() {
        let _ = writeln!(o, "Call sites of the stalls");
        let _ = writeln!(o, "{}", "━".repeat(WIDTH));
        sites(&mut o, &r.call_sites[..r.call_sites.len().min(5)], "");
        let _ = writeln!(o);
    }
    blocked(&mut o, r);
    reference(&mut o, r);
    o
}

/// `28% at loader.py:212 in _next_batch, waiting on a queue`, then the syscall and callers.
fn blocked(o: &mut String, r: &Report) {
    if r.blocked_sites.is_empty() {
        return;
    }
    let _ = writeln!(o, "Where the host blocked (off CPU outside CUDA/NCCL calls)");
    let _ = writeln!(o, "{}", "━".repeat(WIDTH));
    let (feeding, others): (Vec<&BlockedSite>, Vec<&BlockedSite>) = r.blocked_sites.iter().partition(|b| b.feeds_gpu);
    if feeding.is_empty() {
        let _ = writeln!(o, "The threads that feed the GPU did not block.");
    }
    blocked_list(o, &feeding, 5, "");
    if !others.is_empty() {
        wrap(o, "", "", "Other threads (no CUDA/NCCL call; share of one thread's time):");
        blocked_list(o, &others, 3, "  ");
    }
    let _ = writeln!(o);
}

fn blocked_list(o: &mut String, sites: &[&BlockedSite], n: usize, indent: &str) {
    for b in sites.iter().take(n) {
        wrap(o, indent, &format!("{indent}  "), &b.label());
        let s = &b.site;
        let n = if s.count == 1 { "episode" } else { "episodes" };
        let mut line =
            format!("{} {n} in {}, longest {}, total {}", s.count, s.op, fmt_ns(s.max_ns), fmt_ns(s.total_ns));
        if let Some(t) = super::sites::threads_phrase(&s.threads) {
            line = format!("{line}, {t}");
        }
        wrap(o, &format!("{indent}  "), &format!("{indent}  "), &line);
    }
}

/// Each chain: cause → effect → fix, and where its stalls were made.
fn chains(o: &mut String, r: &Report) {
    for c in &r.chains {
        let sev = match c.severity {
            Severity::High => "HIGH",
            Severity::Medium => "MEDIUM",
            Severity::Low => "LOW",
        };
        wrap(o, "", "  ", &format!("{sev} {}", c.title));
        if let Some(x) = c.explains {
            let _ = writeln!(o, "  Explains: {} of the time", super::chains::pct(x));
        }
        for x in &c.root_cause {
            wrap(o, "  Root: ", "        ", x);
        }
        for x in &c.effect {
            wrap(o, "  Effect: ", "          ", x);
        }
        for x in &c.contributing {
            wrap(o, "  Contributing: ", "                ", x);
        }
        for x in &c.fixes {
            wrap(o, "  Fix: ", "       ", x);
        }
        if !c.call_sites.is_empty() {
            let _ = writeln!(o, "  Where:");
            sites(o, &c.call_sites[..c.call_sites.len().min(3)], "    ");
        }
        let _ = writeln!(o);
    }
}

/// `train.py:57 train_step → cudaStreamSynchronize: 212 stalls, p99 48ms`,
/// then the frames around it (callers), innermost first.
fn sites(o: &mut String, sites: &[super::sites::CallSite], indent: &str) {
    for s in sites {
        let mut head = format!(
            "{} → {}: {} stall{}, p99 {}, total {}",
            s.label(),
            s.op,
            s.count,
            if s.count == 1 { "" } else { "s" },
            fmt_ns(s.p99_ns),
            fmt_ns(s.total_ns)
        );
        if let Some(t) = super::sites::threads_phrase(&s.threads) {
            head = format!("{head}, {t}");
        }
        wrap(o, indent, &format!("{indent}  "), &head);
        for f in s.frames.iter().skip(1).take(4) {
            let file = f.file.rsplit('/').next().unwrap_or(&f.file);
            let at = f.line.map_or(String::new(), |l| format!(":{l}"));
            wrap(o, &format!("{indent}  ↳ "), &format!("{indent}    "), &format!("{file}{at} {}", f.function));
        }
        if s.frames.len() > 5 {
            let _ = writeln!(o, "{indent}  ↳ … {} more", s.frames.len() - 5);
        }
    }
}

/// At most 80 columns: 28 + 11 + 4 × 10.
fn calls_table(out: &mut String, ops: &[OpStat]) {
    use super::ops::{NAME, SHOWN, by_kind, calls, dur, name, seen_line};
    if ops.is_empty() {
        return;
    }
    let shown: Vec<&OpStat> = ops.iter().take(SHOWN).collect();
    let _ = writeln!(out, "CUDA/NCCL calls, most time first");
    let _ = writeln!(out, "{}", "━".repeat(WIDTH));
    let _ = writeln!(out, "{:<NAME$}{:>11}{:>10}{:>10}{:>10}{:>10}", "op", "calls", "total", "p50", "p99", "max");
    for o in &shown {
        let _ = writeln!(
            out,
            "{:<NAME$}{:>11}{:>10}{:>10}{:>10}{:>10}",
            name(&o.op),
            calls(o),
            dur(Some(o.total_ns)),
            dur(o.p50_ns),
            dur(o.p99_ns),
            dur(Some(o.max_ns))
        );
    }
    if ops.len() > SHOWN {
        let _ = writeln!(out, "… {} more ops in --format json", ops.len() - SHOWN);
    }
    if let Some(k) = by_kind(ops) {
        wrap(out, "By kind: ", "  ", &k);
    }
    if let Some(seen) = seen_line(&shown) {
        wrap(out, "", "  ", &format!("≈ estimated under the agent's trap budget; calls seen: {seen}."));
    }
    if shown.iter().any(|o| o.sampled) {
        let _ = writeln!(out, "Times of some ops come from a sample of their calls.");
    }
    let _ = writeln!(out);
}

/// Step times, where the job labelled its steps.
fn steps(o: &mut String, r: &Report) {
    let Some(s) = &r.steps else { return };
    let (title, ended) = match &s.ended_by {
        Some(op) => ("Steps (found from the cycle of its calls)", format!(", each ended by a {op}")),
        None => ("Steps (as the job labelled them)", String::new()),
    };
    let _ = writeln!(o, "{title}");
    let _ = writeln!(o, "{}", "━".repeat(WIDTH));
    let epochs = match s.epochs.len() {
        0 => String::new(),
        1 => format!(" in epoch {}", s.epochs[0]),
        n => format!(" over {n} epochs ({} … {})", s.epochs[0], s.epochs[n - 1]),
    };
    // Durations in the unit that shows them (a 3-ms step is no "0.00 s").
    let secs = |x: f64| fmt_ns((x * 1e9) as u64);
    wrap(o, "", "  ", &format!("{} steps{epochs}{ended}; median {}.", s.count, secs(s.median_s)));
    if let Some(u) = &s.unfinished {
        let x = if s.median_s > 0.0 { format!(" ({:.0}× the median)", u.seconds / s.median_s) } else { String::new() };
        let line = format!(
            "The last step had not ended when the data ends: none ended for {} or more{x} after the window from {} (the loop stopped, or one step still runs).",
            secs(u.seconds),
            u.start
        );
        wrap(o, "  ", "    ", &line);
    }
    if s.slowest.is_empty() && s.unfinished.is_none() {
        wrap(o, "  ", "    ", "No step took 1.5× the median or longer.");
    }
    for t in &s.slowest {
        let epoch = t.epoch.as_ref().map(|e| format!(" (epoch {e})")).unwrap_or_default();
        let x = if s.median_s > 0.0 { format!(", {:.1}× the median", t.seconds / s.median_s) } else { String::new() };
        let line = if s.ended_by.is_some() {
            format!("a step of {}{x}, in the window from {}", secs(t.seconds), t.start)
        } else {
            format!("step {}{epoch}: {}{x}, from {}", t.step, secs(t.seconds), t.start)
        };
        wrap(o, "  ", "    ", &line);
    }
    let _ = writeln!(o);
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
    use crate::report::ops::tests::op;

    #[test]
    fn wraps_at_80_columns() {
        let mut o = String::new();
        wrap(&mut o, "  Fix: ", "       ", &"word ".repeat(60));
        assert!(o.lines().all(|l| l.chars().count() <= WIDTH), "{o}");
        assert!(o.lines().count() > 3);
    }

    #[test]
    fn a_name_longer_than_a_line_is_cut_at_its_dots_and_nothing_is_lost() {
        let name =
            "DistributedDataParallelTrainerWithAVeryLongClassName.run_one_training_iteration_with_a_long_method_name";
        let text = format!(
            "49% at a_rather_long_training_script_name_for_the_80_column_check.py:34 in {name}, waiting on a sleep"
        );
        let mut o = String::new();
        wrap(&mut o, "  Root: ", "        ", &text);
        assert!(o.lines().all(|l| l.chars().count() <= WIDTH), "{o}");
        assert!(o.lines().all(|l| l.trim() != "in"), "a word left alone before the long one:\n{o}");
        assert!(o.contains("DistributedDataParallelTrainerWithAVeryLongClassName.\n"), "not cut at the dot:\n{o}");
        let joined: String = o.lines().map(|l| l.trim_start_matches("  Root: ").trim()).collect::<Vec<_>>().join(" ");
        assert_eq!(joined.replace(". ", ".").replace("_ ", "_"), text, "{o}");
        // No break character at all: cut at the width.
        let mut o = String::new();
        wrap(&mut o, "", "  ", &"x".repeat(200));
        assert_eq!(o.lines().map(|l| l.chars().count()).collect::<Vec<_>>(), [80, 80, 44], "{o}");
    }

    #[test]
    fn the_table_of_calls_fits_80_columns_and_marks_estimates_and_untimed_calls() {
        let mut v = vec![
            op("cudaStreamSynchronize", 12_345, 4_210_000_000, Some(310_000), None),
            op("cudaLaunchKernel", 842_000, 0, None, Some(0.25)),
            op("ncclDevCommCreateWithAVeryLongName_v2", 7, 9_000, Some(1_000), None),
        ];
        v.extend((0..9).map(|i| op(&format!("cuOp{i}"), 1, 1, Some(1), None)));
        let mut o = String::new();
        calls_table(&mut o, &v);
        assert!(o.lines().all(|l| l.chars().count() <= 80), "{o}");
        let sync = o.lines().find(|l| l.starts_with("cudaStreamSynchronize")).unwrap();
        assert!(sync.contains("12,345") && sync.contains("4.21s") && sync.contains("310µs"), "{sync}");
        let launch = o.lines().find(|l| l.starts_with("cudaLaunchKernel")).unwrap();
        assert!(launch.contains("≈842,000"), "{launch}");
        assert_eq!(launch.matches('—').count(), 4, "an untimed op shows no times: {launch}");
        assert!(o.contains("ncclDevCommCreateWithAVery…  "), "{o}");
        assert!(o.contains("… 4 more ops in --format json"), "{o}");
        assert!(o.contains("calls seen: cudaLaunchKernel 25%."), "{o}");
        // Summed by what the calls do, over every op, not only those shown.
        assert!(o.contains("By kind: ≈842,000 launches · 12,345 syncs · 16 others"), "{o}");
    }

    #[test]
    fn exact_counts_carry_no_mark_and_no_ops_no_section() {
        let mut o = String::new();
        calls_table(&mut o, &[op("cudaMemcpyAsync", 1_000, 5_000_000, Some(5_000), None)]);
        assert!(o.contains("1,000") && !o.contains('≈'), "{o}");
        let mut empty = String::new();
        calls_table(&mut empty, &[]);
        assert!(empty.is_empty());
    }
}
