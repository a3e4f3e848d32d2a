//! One self-contained HTML page (inline CSS and SVG, no scripts, no fetches).

use std::fmt::Write;

use super::chains::{fmt_ns, Severity};
use super::Report;

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

struct Line<'a> {
    label: &'a str,
    color: &'a str,
    points: Vec<(f64, Option<f64>)>,
}

/// A line chart of time (seconds from the first window) against values.
fn chart(title: &str, unit: &str, lines: &[Line<'_>]) -> String {
    let (w, h, l, r, t, b) = (720.0, 220.0, 56.0, 16.0, 28.0, 34.0);
    let xs = lines.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let xmax = xs.fold(1.0f64, f64::max);
    let ymax = lines.iter().flat_map(|s| s.points.iter().filter_map(|p| p.1)).fold(0.0f64, f64::max);
    let ymax = if ymax <= 0.0 { 1.0 } else { ymax * 1.1 };
    let px = |x: f64| l + (w - l - r) * x / xmax;
    let py = |y: f64| t + (h - t - b) * (1.0 - y / ymax);
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<figure><svg viewBox="0 0 {w} {h}" role="img" aria-label="{}"><text x="{l}" y="18" class="ct">{}</text>"#,
        esc(title),
        esc(title)
    );
    for i in 0..=4 {
        let y = ymax * i as f64 / 4.0;
        let _ = write!(
            o,
            r#"<line x1="{l}" x2="{}" y1="{py:.1}" y2="{py:.1}" class="grid"/><text x="{}" y="{:.1}" class="ax" text-anchor="end">{}</text>"#,
            w - r,
            l - 6.0,
            py(y) + 4.0,
            fmt_axis(y, unit),
            py = py(y)
        );
    }
    let _ = write!(
        o,
        r#"<text x="{}" y="{}" class="ax" text-anchor="middle">seconds from start (0–{xmax:.0})</text>"#,
        (l + w - r) / 2.0,
        h - 8.0
    );
    for (k, s) in lines.iter().enumerate() {
        let mut d = String::new();
        let mut pen = false;
        for (x, y) in &s.points {
            match y {
                Some(y) => {
                    let _ = write!(d, "{}{:.1},{:.1} ", if pen { "L" } else { "M" }, px(*x), py(*y));
                    pen = true;
                }
                None => pen = false,
            }
        }
        let _ = write!(o, r#"<path d="{d}" fill="none" stroke="{}" stroke-width="2"/>"#, s.color);
        let lx = l + 10.0 + 230.0 * k as f64;
        let _ = write!(
            o,
            r#"<rect x="{lx}" y="{}" width="12" height="3" fill="{}"/><text x="{}" y="{}" class="ax">{}</text>"#,
            t + 4.0,
            s.color,
            lx + 16.0,
            t + 8.0,
            esc(s.label)
        );
    }
    o.push_str("</svg></figure>");
    o
}

fn fmt_axis(y: f64, unit: &str) -> String {
    match unit {
        "%" => format!("{:.0}%", y * 100.0),
        "ms" => format!("{y:.1}ms"),
        _ => format!("{y:.1}"),
    }
}

pub fn render(r: &Report) -> String {
    let t0 = r.series.first().map_or(0, |p| p.t_us);
    let x = |t: i64| (t - t0) as f64 / 1e6;
    let node = r.nodes.join(", ");
    let stall = chart(
        "Host stall share of the training threads (run-queue + off-CPU)",
        "%",
        &[
            Line {
                label: &format!("this ({node})"),
                color: "#d62728",
                points: r.series.iter().map(|p| (x(p.t_us), Some(p.runq_share + p.offcpu_share))).collect(),
            },
            Line {
                label: "job's other nodes (median)",
                color: "#1f77b4",
                points: r.series.iter().map(|p| (x(p.t_us), p.peer_stall_share)).collect(),
            },
        ],
    );
    let sync_chart = chart(
        "cudaStreamSynchronize p99 latency",
        "ms",
        &[Line {
            label: "p99 per window",
            color: "#9467bd",
            points: r.series.iter().map(|p| (x(p.t_us), p.sync_p99_ns.map(|n| n as f64 / 1e6))).collect(),
        }],
    );
    let nccl = chart(
        "Time waiting in NCCL collectives",
        "%",
        &[
            Line {
                label: "this node",
                color: "#d62728",
                points: r.series.iter().map(|p| (x(p.t_us), Some(p.nccl_share))).collect(),
            },
            Line {
                label: "job's other nodes (median)",
                color: "#1f77b4",
                points: r.series.iter().map(|p| (x(p.t_us), p.peer_nccl_share)).collect(),
            },
        ],
    );
    let mut chains = String::new();
    if r.chains.is_empty() {
        chains.push_str(
            "<p class=ok>No stall found: host stall, IO, memory and collective waits are within normal ranges.</p>",
        );
    }
    for c in &r.chains {
        let sev = match c.severity {
            Severity::High => "high",
            Severity::Medium => "medium",
            Severity::Low => "low",
        };
        let li = |label: &str, items: &[String]| -> String {
            if items.is_empty() {
                return String::new();
            }
            format!("<dt>{label}</dt>{}", items.iter().map(|i| format!("<dd>{}</dd>", esc(i))).collect::<String>())
        };
        let _ = write!(
            chains,
            r#"<section class="chain {sev}"><h3><span class="sev">{}</span> {}</h3><dl>{}{}{}{}</dl></section>"#,
            sev.to_uppercase(),
            esc(&c.title),
            li("Root cause", &c.root_cause),
            li("Effect", &c.effect),
            li("Contributing", &c.contributing),
            li("Fix", &c.fixes)
        );
    }
    let strag: String = r
        .straggler
        .iter()
        .map(|s| {
            format!(
                "<p class=flag>{} in job <b>{}</b>: {} (score {:.1}) — {}</p>",
                esc(&s.node),
                esc(&s.job),
                if s.flagged { "<b>flagged straggler</b>" } else { "deviating" },
                s.score,
                esc(&s.signals.iter().map(|d| d.text.clone()).collect::<Vec<_>>().join("; "))
            )
        })
        .collect();
    let neigh: String = r
        .neighbours
        .iter()
        .map(|n| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=num>{:.2}</td></tr>",
                esc(&match (&n.namespace, &n.pod) {
                    (Some(a), Some(b)) => format!("{a}/{b}"),
                    _ => "—".into(),
                }),
                esc(&n.comm),
                esc(&n.cgroup_path),
                n.cores
            )
        })
        .collect();
    let s = &r.summary;
    let sync = if let (Some(b), Some(w)) = (s.sync_p99_baseline_ns, s.sync_p99_worst_ns) {
        format!("{} → {}", fmt_ns(b), fmt_ns(w))
    } else {
        "—".into()
    };
    format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Ingero report: {title}</title><style>
body{{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f6f7f9;color:#1b1f24}}
main{{max-width:820px;margin:0 auto;padding:24px}} h1{{font-size:22px;margin:0 0 4px}} .meta{{color:#57606a;margin:0 0 16px}}
.kpis{{display:grid;grid-template-columns:repeat(4,1fr);gap:8px;margin:12px 0}} .kpi{{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:8px 10px}}
.kpi b{{display:block;font-size:20px}} .kpi span{{color:#57606a;font-size:12px}}
.chain{{background:#fff;border:1px solid #d0d7de;border-left:6px solid #999;border-radius:6px;padding:10px 14px;margin:10px 0}}
.chain.high{{border-left-color:#cf222e}} .chain.medium{{border-left-color:#bf8700}} .chain.low{{border-left-color:#57606a}}
.chain h3{{margin:0 0 6px;font-size:16px}} .sev{{font-size:12px;padding:1px 6px;border-radius:4px;background:#1b1f24;color:#fff;vertical-align:middle}}
dt{{font-weight:600;margin-top:4px}} dd{{margin:0 0 0 16px}} figure{{background:#fff;border:1px solid #d0d7de;border-radius:6px;margin:10px 0;padding:6px}}
svg{{width:100%;height:auto}} .ct{{font-size:13px;font-weight:600;fill:#1b1f24}} .ax{{font-size:11px;fill:#57606a}} .grid{{stroke:#eaeef2}}
table{{border-collapse:collapse;width:100%;background:#fff}} td,th{{border:1px solid #d0d7de;padding:4px 8px;text-align:left;font-size:13px}} .num{{text-align:right}}
.flag{{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:6px 10px}} .ok{{background:#dafbe1;padding:8px;border-radius:6px}}
</style></head><body><main>
<h1>Stall report: {title}</h1><p class="meta">{from} → {to} · nodes {nodes} · job {jobs} · {procs}</p>
<div class="kpis"><div class="kpi"><b>{stall:.0}%</b><span>host stall share</span></div><div class="kpi"><b>{runq:.0}%</b><span>run-queue wait</span></div>
<div class="kpi"><b>{off:.0}%</b><span>off-CPU</span></div><div class="kpi"><b>{sync}</b><span>sync p99 calm → worst</span></div></div>
{strag}<h2>Causal chains</h2>{chains}<h2>Over time</h2>{stall_chart}{sync_chart}{nccl_chart}
<h2>Other CPU users on the node</h2><table><tr><th>pod</th><th>process</th><th>cgroup</th><th>cores</th></tr>{neigh}</table>
<p class="meta">Generated by Ingero {ver}. Self-contained: no scripts, no network.</p></main></body></html>
"#,
        title = esc(&r.target),
        from = esc(&r.from),
        to = esc(&r.to),
        nodes = esc(&r.nodes.join(", ")),
        jobs = esc(&r.jobs.join(", ")),
        procs = esc(&r.processes.join(", ")),
        stall = s.stall_share * 100.0,
        runq = s.runq_share * 100.0,
        off = s.offcpu_share * 100.0,
        sync = esc(&sync),
        stall_chart = stall,
        sync_chart = sync_chart,
        nccl_chart = nccl,
        ver = env!("CARGO_PKG_VERSION"),
    )
}
