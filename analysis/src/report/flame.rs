// SPDX-License-Identifier: Apache-2.0
//! Call sites in the HTML report: a table per chain and for the whole
//! target, and a flame graph of stall time by stack (self-contained SVG:
//! callers at the bottom, the CUDA/NCCL call on top).

use std::collections::BTreeMap;
use std::fmt::Write;

use super::chains::fmt_ns;
use super::escape::esc;
use super::sites::CallSite;

const W: f64 = 800.0;
const ROW: f64 = 18.0;

/// A table of call sites; native frames behind a disclosure.
pub(crate) fn table(sites: &[CallSite]) -> String {
    if sites.is_empty() {
        return String::new();
    }
    let mut rows = String::new();
    for s in sites {
        let callers: Vec<String> = s
            .frames
            .iter()
            .skip(1)
            .take(6)
            .map(|f| {
                let file = f.file.rsplit('/').next().unwrap_or(&f.file);
                format!("{file}{} {}", f.line.map_or(String::new(), |l| format!(":{l}")), f.function)
            })
            .collect();
        let threads = super::sites::threads_phrase(&s.threads)
            .map_or(String::new(), |t| format!(r#"<div class="callers">{}</div>"#, esc(&t)));
        let native = if s.native.is_empty() {
            String::new()
        } else {
            let frames: String = s
                .native
                .iter()
                .map(|n| format!("<li>{} <code>{}</code> +{:#x}</li>", esc(&n.file), esc(&n.function), n.offset))
                .collect();
            format!("<details><summary>native frames ({})</summary><ol>{frames}</ol></details>", s.native.len())
        };
        let _ = write!(
            rows,
            r#"<tr><td><b>{}</b><div class="callers">{}</div>{threads}{native}</td><td><code>{}</code></td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>"#,
            esc(&s.label()),
            callers.iter().map(|c| format!("↳ {}", esc(c))).collect::<Vec<_>>().join("<br>"),
            esc(&s.op),
            s.count,
            fmt_ns(s.p99_ns),
            fmt_ns(s.total_ns),
        );
    }
    format!(
        r#"<table class="sites"><tr><th>call site (innermost first)</th><th>call</th><th class="num">stalls</th><th class="num">p99</th><th class="num">total</th></tr>{rows}</table>"#
    )
}

#[derive(Default)]
struct Node {
    ns: u64,
    children: BTreeMap<String, Node>,
}

/// Stall time by stack: each box is a frame, as wide as the stall time
/// under it; the top box of a column is the CUDA/NCCL call.
pub(crate) fn flame(sites: &[CallSite]) -> String {
    let mut root = Node::default();
    for s in sites.iter().filter(|s| s.total_ns > 0) {
        let mut path: Vec<String> = s
            .frames
            .iter()
            .rev()
            .map(|f| {
                let file = f.file.rsplit('/').next().unwrap_or(&f.file);
                format!("{} ({file}{})", f.function, f.line.map_or(String::new(), |l| format!(":{l}")))
            })
            .collect();
        path.push(s.op.clone());
        root.ns += s.total_ns;
        let mut n = &mut root;
        for p in path {
            n = n.children.entry(p).or_default();
            n.ns += s.total_ns;
        }
    }
    if root.ns == 0 {
        return String::new();
    }
    let depth = max_depth(&root);
    let h = (depth as f64 + 1.0) * ROW + 4.0;
    let mut boxes = String::new();
    draw(&root, 0.0, 0, root.ns as f64, &mut boxes, h);
    format!(
        r#"<figure><svg viewBox="0 0 {W} {h}" role="img" aria-label="flame graph of stall time by stack"><text class="ct" x="0" y="12">Stall time by stack (callers below, the call on top)</text>{boxes}</svg></figure>"#
    )
}

fn max_depth(n: &Node) -> usize {
    n.children.values().map(|c| 1 + max_depth(c)).max().unwrap_or(0)
}

fn draw(n: &Node, x: f64, level: usize, total: f64, out: &mut String, h: f64) {
    let mut at = x;
    for (name, c) in &n.children {
        let w = c.ns as f64 / total * W;
        let y = h - (level as f64 + 1.0) * ROW;
        let top = c.children.is_empty();
        let fill = if top { "#cf222e" } else { ["#f0883e", "#f2cc60", "#e3b341"][level % 3] };
        let label = if w > 60.0 { truncate(name, (w / 6.5) as usize) } else { String::new() };
        let _ = write!(
            out,
            r##"<g><title>{} — {}</title><rect x="{at:.1}" y="{y:.1}" width="{:.1}" height="{}" fill="{fill}" stroke="#fff"/><text class="fl" x="{:.1}" y="{:.1}">{}</text></g>"##,
            esc(name),
            fmt_ns(c.ns),
            (w - 0.5).max(0.5),
            ROW - 1.0,
            at + 3.0,
            y + 12.5,
            esc(&label)
        );
        draw(c, at, level + 1, total, out, h);
        at += w;
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n.saturating_sub(1)).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::super::sites::SiteFrame;
    use super::*;

    #[test]
    fn flame_stacks_callers_below_the_call() {
        let f = |func: &str, l| SiteFrame { file: "/w/train.py".into(), function: func.into(), line: Some(l) };
        let site = |op: &str, frames, ns| CallSite {
            op: op.into(),
            library: "cudart".into(),
            count: 1,
            total_ns: ns,
            p99_ns: ns,
            max_ns: ns,
            frames,
            native: vec![],
            threads: vec![],
        };
        let sites = vec![
            site("cudaStreamSynchronize", vec![f("train_step", 57), f("<module>", 90)], 3_000_000),
            site("cudaMemcpy", vec![f("load", 20), f("<module>", 91)], 1_000_000),
        ];
        let svg = flame(&sites);
        assert_eq!(svg.matches("<rect").count(), 6, "two columns of three boxes: {svg}");
        assert!(svg.contains("train_step (train.py:57)") && svg.contains("cudaStreamSynchronize — 3.0ms"));
        let html = table(&sites);
        assert!(html.contains("train.py:57 train_step") && html.contains("↳ train.py:90 &lt;module&gt;"), "{html}");
        assert_eq!(flame(&[]), "");
    }
}
