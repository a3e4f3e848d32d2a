// SPDX-License-Identifier: Apache-2.0
//! One self-contained HTML page (inline CSS and SVG, no scripts, no fetches).
//! Built with maud: every value spliced into the page is escaped by it.

use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::Report;
use super::chains::{Severity, fmt_ns};

struct Line<'a> {
    label: &'a str,
    color: &'a str,
    points: Vec<(f64, Option<f64>)>,
}

/// What the job said about its time, on every chart: its slowest steps as
/// shaded spans, its epochs' starts as dashed lines (seconds from the first window).
#[derive(Default)]
struct Marks {
    spans: Vec<(f64, f64, String)>,
    lines: Vec<(f64, String)>,
}

impl Marks {
    fn of(r: &Report, x: impl Fn(i64) -> f64) -> Marks {
        let Some(s) = &r.steps else { return Marks::default() };
        if s.ended_by.is_some() {
            // Found steps are known by the window they ended in, not their span.
            return Marks::default();
        }
        Marks {
            spans: s
                .slowest
                .iter()
                .map(|t| (x(t.start_us), x(t.start_us) + t.seconds, format!("step {}", t.step)))
                .collect(),
            lines: s
                .epochs
                .iter()
                .zip(&s.epoch_starts_us)
                .skip(1)
                .map(|(e, t)| (x(*t), format!("epoch {e}")))
                .collect(),
        }
    }
}

/// A line chart of time (seconds from the first window) against values.
fn chart(title: &str, unit: &str, lines: &[Line<'_>], marks: &Marks) -> Markup {
    let (w, h, l, r, t, b) = (720.0, 232.0, 56.0, 16.0, 40.0, 34.0);
    let xs = lines.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let xmax = xs.fold(1.0f64, f64::max);
    let ymax = lines.iter().flat_map(|s| s.points.iter().filter_map(|p| p.1)).fold(0.0f64, f64::max);
    let ymax = axis_top(ymax, unit);
    let px = |x: f64| l + (w - l - r) * x / xmax;
    let py = |y: f64| t + (h - t - b) * (1.0 - y / ymax);
    // SVG elements are not void in HTML: each closes explicitly (`{}`).
    html! {
        figure {
            svg viewBox=(format!("0 0 {w} {h}")) role="img" aria-label=(title) {
                text x=(l) y="18" class="ct" { (title) }
                @for i in 0..=4 {
                    @let y = ymax * i as f64 / 4.0;
                    line x1=(l) x2=(w - r) y1=(format!("{:.1}", py(y))) y2=(format!("{:.1}", py(y))) class="grid" {}
                    text x=(l - 6.0) y=(format!("{:.1}", py(y) + 4.0)) class="ax" text-anchor="end" {
                        (fmt_axis(y, ymax / 4.0, unit))
                    }
                }
                @for (x, label) in x_ticks(xmax) {
                    text x=(format!("{:.1}", px(x))) y=(h - b + 14.0) class="ax" text-anchor="middle" { (label) }
                }
                text x=((l + w - r) / 2.0) y=(h - 4.0) class="ax" text-anchor="middle" { "time from the report's start" }
                @for (a, z, label) in marks.spans.iter().filter(|m| m.0 >= 0.0 && m.0 <= xmax) {
                    @let (x0, x1) = (px(*a), px(z.min(xmax)));
                    rect x=(format!("{x0:.1}")) y=(t) width=(format!("{:.1}", (x1 - x0).max(1.0))) height=(h - t - b) class="slow" {}
                    text x=(format!("{:.1}", x0 + 2.0)) y=(h - b - 4.0) class="mk" { (label) }
                }
                @for (a, label) in marks.lines.iter().filter(|m| m.0 >= 0.0 && m.0 <= xmax) {
                    line x1=(format!("{:.1}", px(*a))) x2=(format!("{:.1}", px(*a))) y1=(t) y2=(h - b) class="epoch" {}
                    text x=(format!("{:.1}", px(*a) + 2.0)) y=(t + 20.0) class="mk" { (label) }
                }
                @for (k, s) in lines.iter().enumerate() {
                    @let lx = l + 10.0 + 230.0 * k as f64;
                    path d=(path(&s.points, px, py)) fill="none" stroke=(s.color) stroke-width="2" {}
                    // Above the plot: a line at its top never runs through it.
                    rect x=(lx) y=(t - 12.0) width="12" height="3" fill=(s.color) {}
                    text x=(lx + 16.0) y=(t - 8.0) class="ax" { (s.label) }
                }
            }
        }
    }
}

/// Labels under the x axis: 0 and every round step up to `xmax` seconds,
/// 6 steps at most.
fn x_ticks(xmax: f64) -> Vec<(f64, String)> {
    const STEPS: [u64; 16] = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21_600, 86_400];
    let step =
        STEPS.into_iter().find(|&s| xmax / s as f64 <= 6.0).unwrap_or(86_400 * (xmax / 86_400.0 / 6.0).ceil() as u64);
    let label = |x: u64| match x {
        0 => "0".to_string(),
        x if x % 3600 == 0 => format!("{}h", x / 3600),
        x if x % 60 == 0 => format!("{}m", x / 60),
        x if x > 60 => format!("{}m{}s", x / 60, x % 60),
        x => format!("{x}s"),
    };
    (0..).map(|k| k * step).take_while(|&x| x as f64 <= xmax).map(|x| (x as f64, label(x))).collect()
}

/// SVG path data of a line; a gap (None) lifts the pen.
fn path(points: &[(f64, Option<f64>)], px: impl Fn(f64) -> f64, py: impl Fn(f64) -> f64) -> String {
    let mut d = String::new();
    let mut pen = false;
    for (x, y) in points {
        match y {
            Some(y) => {
                d += &format!("{}{:.1},{:.1} ", if pen { "L" } else { "M" }, px(*x), py(*y));
                pen = true;
            }
            None => pen = false,
        }
    }
    d
}

/// The axis's top: four steps of 1, 2, 2.5 or 5 × 10^k, the first above
/// the data's maximum; a share's axis stops at 100%.
fn axis_top(max: f64, unit: &str) -> f64 {
    if max.is_nan() || max <= 0.0 {
        return 1.0;
    }
    let raw = max * 1.05 / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let top = step * 4.0;
    if unit == "%" && max <= 1.0 { top.min(1.0) } else { top }
}

/// A tick's label, with the decimals its step needs (ticks 0.25 ms apart
/// are no "0.2ms, 0.5ms, 0.8ms"); milliseconds below one in microseconds.
fn fmt_axis(y: f64, step: f64, unit: &str) -> String {
    let (y, step, suffix) = match unit {
        "%" => (y * 100.0, step * 100.0, "%"),
        "ms" if step * 4.0 < 1.0 => (y * 1000.0, step * 1000.0, "µs"),
        "ms" => (y, step, "ms"),
        _ => (y, step, ""),
    };
    let mut decimals = 0;
    while decimals < 6 && ((step * 10f64.powi(decimals)).round() - step * 10f64.powi(decimals)).abs() > 1e-6 {
        decimals += 1;
    }
    format!("{y:.prec$}{suffix}", prec = decimals as usize)
}

/// The whole page: self-contained, no scripts, no network.
pub fn render(r: &Report) -> String {
    let s = &r.summary;
    let sync = match (s.sync_p99_baseline_ns, s.sync_p99_worst_ns) {
        (Some(b), Some(w)) => format!("{} → {}", fmt_ns(b), fmt_ns(w)),
        (Some(b), None) => format!("{} → no slower", fmt_ns(b)),
        _ => "—".into(),
    };
    let kpi = |value: String, label: &str| html! { div.kpi { b { (value) } span { (label) } } };
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Ingero report: " (r.target) }
                // Our own constant, raw: a style element's text is not entity-decoded.
                style { (PreEscaped(STYLE)) }
            }
            body { main {
                h1 { "Stall report: " (r.target) }
                p.meta {
                    (r.from) " → " (r.to) " · nodes " (r.nodes.join(", "))
                    @if !r.jobs.is_empty() { " · job " (r.jobs.join(", ")) }
                    " · " (r.processes.join(", ")) (super::renamed(r))
                }
                div.kpis {
                    (kpi(format!("{:.0}%", s.stall_share * 100.0), "host stall share"))
                    (kpi(format!("{:.0}%", s.runq_share * 100.0), "run-queue wait"))
                    (kpi(format!("{:.0}%", s.offcpu_share * 100.0), "off-CPU"))
                    (kpi(sync, "sync p99 calm → worst"))
                }
                (stragglers(r))
                h2 { "Causal chains" }
                (chains(r))
                (steps(r))
                (super::ops::html(&r.ops))
                @if !r.call_sites.is_empty() {
                    h2 { "Where the stalls were made" }
                    // Hand-built SVG and table from flame.rs, which escapes its own text.
                    (PreEscaped(super::flame::flame(&r.call_sites)))
                    (PreEscaped(super::flame::table(&r.call_sites)))
                }
                (blocked(r))
                h2 { "Over time" }
                (charts(r))
                @if !r.neighbours.is_empty() {
                    h2 { "Other CPU users on the node" }
                    table {
                        tr { th { "pod" } th { "process" } th { "cgroup" } th { "cores" } }
                        (neighbours(r))
                    }
                }
                (reference(r))
                p.meta { "Generated by Ingero " (env!("CARGO_PKG_VERSION")) ". Self-contained: no scripts, no network." }
            } }
        }
    };
    page.into_string() + "\n"
}

const STYLE: &str = "
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f6f7f9;color:#1b1f24}
main{max-width:820px;margin:0 auto;padding:24px;overflow-wrap:anywhere} h1{font-size:22px;margin:0 0 4px} .meta{color:#57606a;margin:0 0 16px}
.kpis{display:grid;grid-template-columns:repeat(4,1fr);gap:8px;margin:12px 0} .kpi{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:8px 10px}
.kpi b{display:block;font-size:20px} .kpi span{color:#57606a;font-size:12px}
.chain{background:#fff;border:1px solid #d0d7de;border-left:6px solid #999;border-radius:6px;padding:10px 14px;margin:10px 0}
.chain.high{border-left-color:#cf222e} .chain.medium{border-left-color:#bf8700} .chain.low{border-left-color:#57606a}
.chain h3{margin:0 0 6px;font-size:16px} .sev{font-size:12px;padding:1px 6px;border-radius:4px;background:#1b1f24;color:#fff;vertical-align:middle} .explains{font-size:12px;font-weight:normal;color:#57606a;margin-left:6px}
dt{font-weight:600;margin-top:4px} dd{margin:0 0 0 16px} figure{background:#fff;border:1px solid #d0d7de;border-radius:6px;margin:10px 0;padding:6px}
svg{width:100%;height:auto} .ct{font-size:13px;font-weight:600;fill:#1b1f24} .ax{font-size:11px;fill:#57606a} .grid{stroke:#eaeef2}
table{border-collapse:collapse;width:100%;background:#fff} td,th{border:1px solid #d0d7de;padding:4px 8px;text-align:left;font-size:13px} .num{text-align:right} .num,th,.v,.sites td:nth-child(2){white-space:nowrap;overflow-wrap:normal}
.sites td{vertical-align:top} .callers{color:#57606a;font-size:12px} .fl{font-size:11px;fill:#1b1f24;pointer-events:none} details.where{margin-top:6px} details ol{margin:4px 0;font-size:12px}
.slow{fill:#bf8700;fill-opacity:.13} .epoch{stroke:#57606a;stroke-dasharray:4 3} .mk{font-size:10px;fill:#57606a}
.ops+.meta{margin-top:6px}
.flag{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:6px 10px} .ok{background:#dafbe1;padding:8px;border-radius:6px}
@media (max-width:640px){main{padding:12px} .kpis{grid-template-columns:repeat(2,1fr)} .kpi b{overflow-wrap:normal}
 table{display:block;overflow-x:auto} td,th,code{overflow-wrap:normal}}
";

/// Host stall, sync p99 and collective wait over time, against the job's other nodes.
fn charts(r: &Report) -> Markup {
    let t0 = r.series.first().map_or(0, |p| p.t_us);
    let x = |t: i64| (t - t0) as f64 / 1e6;
    let marks = Marks::of(r, x);
    let node = r.nodes.join(", ");
    let stall = chart(
        "Host stall share of the training threads (run-queue + off-CPU)",
        "%",
        &with_peers(
            Line {
                label: &format!("this ({node})"),
                color: "#d62728",
                points: r.series.iter().map(|p| (x(p.t_us), Some(p.runq_share + p.offcpu_share))).collect(),
            },
            r.series.iter().map(|p| (x(p.t_us), p.peer_stall_share)).collect(),
        ),
        &marks,
    );
    let sync = chart(
        "cudaStreamSynchronize p99 latency",
        "ms",
        &[Line {
            label: "p99 per window",
            color: "#9467bd",
            points: r.series.iter().map(|p| (x(p.t_us), p.sync_p99_ns.map(|n| n as f64 / 1e6))).collect(),
        }],
        &marks,
    );
    let nccl = chart(
        "Time waiting on the GPU and peers (syncs, blocking copies, collectives)",
        "%",
        &with_peers(
            Line {
                label: "this node",
                color: "#d62728",
                points: r.series.iter().map(|p| (x(p.t_us), Some(p.wait_share))).collect(),
            },
            r.series.iter().map(|p| (x(p.t_us), p.peer_wait_share)).collect(),
        ),
        &marks,
    );
    // Steps, where the agents found them: what each stall costs the job.
    let steps = r.series.iter().any(|p| p.step_p50_ns.is_some()).then(|| {
        chart(
            "Step time (median per window, found from the cycle of its calls)",
            "ms",
            &[Line {
                label: "this",
                color: "#2ca02c",
                points: r.series.iter().map(|p| (x(p.t_us), p.step_p50_ns.map(|n| n as f64 / 1e6))).collect(),
            }],
            &marks,
        )
    });
    html! { (stall) @if let Some(s) = steps { (s) } (sync) (nccl) }
}

/// This target's line, and its job's other nodes' where they have data (a
/// lone process has no peers: no legend entry for an empty line).
fn with_peers<'a>(this: Line<'a>, peers: Vec<(f64, Option<f64>)>) -> Vec<Line<'a>> {
    let mut lines = vec![this];
    if peers.iter().any(|(_, v)| v.is_some()) {
        lines.push(Line { label: "job's other nodes (median)", color: "#1f77b4", points: peers });
    }
    lines
}

fn chains(r: &Report) -> Markup {
    // The label is ours; the items are data (escaped by maud).
    let items = |label: &str, items: &[String]| {
        html! {
            @if !items.is_empty() {
                dt { (label) }
                @for i in items { dd { (i) } }
            }
        }
    };
    html! {
        @if r.chains.is_empty() {
            p.ok { "No stall found: host stall, IO, memory and collective waits are within normal ranges." }
        }
        @for c in &r.chains {
            @let sev = match c.severity {
                Severity::High => "high",
                Severity::Medium => "medium",
                Severity::Low => "low",
            };
            section.chain.(sev) {
                h3 {
                    span.sev { (sev.to_uppercase()) }
                    " " (c.title)
                    @if let Some(x) = c.explains {
                        " " span.explains { "explains " (super::chains::pct(x)) " of the time" }
                    }
                }
                dl {
                    (items("Root cause", &c.root_cause))
                    (items("Effect", &c.effect))
                    (items("Contributing", &c.contributing))
                    (items("Fix", &c.fixes))
                }
            }
            @if !c.call_sites.is_empty() {
                details.where {
                    summary {
                        "Where: " (c.call_sites.len()) " call site" @if c.call_sites.len() != 1 { "s" }
                    }
                    // Hand-built by flame.rs, which escapes its own text.
                    (PreEscaped(super::flame::table(&c.call_sites)))
                }
            }
        }
    }
}

/// Where the host blocked: share, place, what it waited on, the callers.
fn blocked(r: &Report) -> Markup {
    if r.blocked_sites.is_empty() {
        return html! {};
    }
    html! {
        h2 { "Where the host blocked" }
        p { "Off CPU outside CUDA/NCCL calls, by the place the thread slept. Threads that feed the GPU (they made a CUDA/NCCL call): share of their time. Other threads, below them: share of one thread's time." }
        table {
            tr { th.num { "share" } th { "where" } th { "waiting on" } th { "syscall" } th.num { "episodes" } th.num { "longest" } th { "callers" } }
            @for (i, b) in r.blocked_sites.iter().enumerate() {
                @if !b.feeds_gpu && (i == 0 || r.blocked_sites[i - 1].feeds_gpu) {
                    tr { td colspan="7" { b { "Other threads (no CUDA/NCCL call)" } } }
                }
                tr {
                    td.num { (super::chains::pct(b.share)) }
                    td { code { (b.at.as_ref().map_or("(no stack captured)".into(), |f| {
                        let file = f.file.rsplit('/').next().unwrap_or(&f.file);
                        format!("{file}{} {}", f.line.map_or(String::new(), |l| format!(":{l}")), f.function)
                    })) }
                        @if let Some(t) = super::sites::threads_phrase(&b.site.threads) { div.callers { (t) } } }
                    td { (b.waiting_on) }
                    td { (b.site.op) }
                    td.num { (b.site.count) }
                    td.num { (super::chains::fmt_ns(b.site.max_ns)) }
                    td { small { (b.site.frames.iter().skip_while(|f| Some(*f) != b.at.as_ref()).skip(1).take(3)
                        .map(|f| format!("{}{}", f.file.rsplit('/').next().unwrap_or(&f.file), f.line.map_or(String::new(), |l| format!(":{l}"))))
                        .collect::<Vec<_>>().join(" ← ")) } }
                }
            }
        }
    }
}

/// Step times, where the job labelled its steps.
fn steps(r: &Report) -> Markup {
    let Some(s) = &r.steps else { return html! {} };
    let title = match &s.ended_by {
        Some(op) => format!("Steps (found from the cycle of its calls; each ends at a {op})"),
        None => "Steps (as the job labelled them)".to_string(),
    };
    html! {
        h2 { (title) }
        p { (s.count) " steps, median " (super::chains::fmt_ns((s.median_s * 1e9) as u64))
            @if !s.epochs.is_empty() { " · epochs " (s.epochs.join(", ")) }
            @if s.slowest.is_empty() && s.unfinished.is_none() { " · no step took 1.5× the median or longer" } }
        @if let Some(u) = &s.unfinished {
            p.flag { "The last step had not ended when the data ends: none ended for "
                (super::chains::fmt_ns((u.seconds * 1e9) as u64)) " or more"
                @if s.median_s > 0.0 { " (" (format!("{:.0}", u.seconds / s.median_s)) "× the median)" }
                " after the window from " (u.start) " (the loop stopped, or one step still runs)." }
        }
        @if !s.slowest.is_empty() { table {
            tr { th { "slowest step" } th { "epoch" } th { @if s.ended_by.is_some() { "ended in the window from" } @else { "from" } } th.num { "seconds" } th.num { "× median" } }
            @for t in &s.slowest {
                tr {
                    td { @if t.step.is_empty() { "—" } @else { (t.step) } } td { (t.epoch.as_deref().unwrap_or("—")) } td { (t.start) }
                    td.num { (format!("{:.2}", t.seconds)) }
                    td.num { @if s.median_s > 0.0 { (format!("{:.1}", t.seconds / s.median_s)) } @else { "—" } }
                }
            }
        } }
    }
}

fn stragglers(r: &Report) -> Markup {
    html! {
        @for s in &r.straggler {
            p.flag {
                (s.node) " in job " b { (s.job) } ": "
                @if s.flagged { b { "flagged straggler" } } @else { "deviating" }
                " (score " (format!("{:.1}", s.score)) ") — "
                (s.signals.iter().map(|d| d.text.as_str()).collect::<Vec<_>>().join("; "))
            }
        }
    }
}

/// The source product's stored diagnoses (imported traces), and ours on each.
fn reference(r: &Report) -> Markup {
    if r.reference.is_empty() {
        return html! {};
    }
    html! {
        h2 { "Diagnoses stored in the imported trace (Ingero Go)" }
        table {
            tr { th { "verdict" } th { "their diagnosis" } th { "why" } th.num { "times" } }
            @for v in &r.reference {
                tr {
                    td.v { b { (v.verdict.to_uppercase()) } }
                    td { (v.their_summary) }
                    td { (v.why) }
                    td.num { (v.count) @if v.count > 1 { br; small { (v.first) " → " (v.last) } } }
                }
            }
        }
    }
}

fn neighbours(r: &Report) -> Markup {
    html! {
        @for n in &r.neighbours {
            tr {
                td {
                    @match (&n.namespace, &n.pod) {
                        (Some(a), Some(b)) => { (a) "/" (b) }
                        _ => "—",
                    }
                }
                td { (n.comm) }
                td { (n.cgroup_path) }
                td.num { (format!("{:.2}", n.cores)) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn x_ticks_are_round_and_few() {
        let t = |xmax: f64| super::x_ticks(xmax).into_iter().map(|(_, l)| l).collect::<Vec<_>>().join(" ");
        assert_eq!(t(29.0), "0 5s 10s 15s 20s 25s");
        assert_eq!(t(300.0), "0 1m 2m 3m 4m 5m");
        assert_eq!(t(3599.0), "0 10m 20m 30m 40m 50m");
        assert_eq!(t(7200.0), "0 30m 1h 90m 2h");
        assert_eq!(t(180.0), "0 30s 1m 1m30s 2m 2m30s 3m");
    }

    use super::*;

    fn ticks(max: f64, unit: &str) -> Vec<String> {
        let top = axis_top(max, unit);
        (0..=4).map(|i| fmt_axis(top * i as f64 / 4.0, top / 4.0, unit)).collect()
    }

    #[test]
    fn axis_ticks_are_round_distinct_and_in_a_unit_that_shows_them() {
        // A share near 100% stops at 100%, not 109%.
        assert_eq!(ticks(0.99, "%"), ["0%", "25%", "50%", "75%", "100%"]);
        // Small shares keep their decimals: no five "0%".
        assert_eq!(ticks(0.0021, "%"), ["0.0%", "0.1%", "0.2%", "0.3%", "0.4%"]);
        // Sub-millisecond latencies in microseconds, each tick its own.
        assert_eq!(ticks(0.089, "ms"), ["0µs", "25µs", "50µs", "75µs", "100µs"]);
        assert_eq!(ticks(55.4, "ms"), ["0ms", "20ms", "40ms", "60ms", "80ms"]);
        for (max, unit) in [(0.0021, "%"), (0.37, "%"), (0.089, "ms"), (1.3, "ms"), (341.6, "ms"), (7.0, "")] {
            let t = ticks(max, unit);
            let mut d = t.clone();
            d.dedup();
            assert_eq!(d.len(), 5, "{max} {unit}: {t:?}");
            assert!(axis_top(max, unit) >= max, "{max} {unit}");
        }
    }
}
