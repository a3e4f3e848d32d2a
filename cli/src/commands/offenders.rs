// SPDX-License-Identifier: Apache-2.0
//! `ingero offenders`: nodes flagged again and again over a stretch of
//! history, with their causes and what they cost (the history ranking's
//! episodes, grouped by node).

use std::collections::BTreeMap;

use clap::Args;
use serde::Serialize;

use super::{CmdResult, Since, SourceArgs};
use ingero_server::rank::Ranking;
use ingero_server::rank::episode::Episode;

#[derive(Debug, Args)]
pub(crate) struct OffendersArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// How far back (7d, 24h) or from an RFC 3339 time.
    #[arg(long, env = "INGERO_SINCE", default_value = "7d", value_parser = Since::parse)]
    pub since: Since,
    /// List nodes flagged at least this many times.
    #[arg(long, env = "INGERO_MIN_EPISODES", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub min_episodes: u32,
    /// Only this job.
    #[arg(long, env = "INGERO_JOB")]
    pub job: Option<String>,
    /// JSON instead of the 80-column table.
    #[arg(long, env = "INGERO_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub rank: crate::cli::RankArgs,
}

/// One repeat offender.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Offender {
    pub node: String,
    pub episodes: usize,
    /// Seconds flagged in the range (an episode still open counts to its last window).
    pub flagged_s: i64,
    pub jobs: Vec<String>,
    /// Cause → episodes, most frequent first.
    pub causes: Vec<(String, usize)>,
    pub gpu_hours: f64,
    /// Where every episode is priced.
    pub usd: Option<f64>,
}

pub(crate) async fn run(a: OffendersArgs) -> CmdResult {
    let json = super::stragglers::fetch(&a.source, a.job.clone(), Some(a.since), true, a.rank.detector()).await?;
    let r: Ranking = serde_json::from_value(json)?;
    let now = chrono::Utc::now().timestamp_micros();
    let list = offenders(&r.episodes, a.min_episodes as usize, now);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        print!("{}", table(&list, r.episodes.len(), a.min_episodes));
    }
    Ok(())
}

/// Nodes with at least `min` episodes, costliest first.
pub(crate) fn offenders(eps: &[Episode], min: usize, now_us: i64) -> Vec<Offender> {
    let mut by_node: BTreeMap<&str, Vec<&Episode>> = BTreeMap::new();
    for e in eps {
        by_node.entry(&e.node).or_default().push(e);
    }
    let mut out: Vec<Offender> = by_node
        .into_iter()
        .filter(|(_, v)| v.len() >= min)
        .map(|(node, v)| {
            let mut causes: BTreeMap<&str, usize> = BTreeMap::new();
            let mut jobs: Vec<String> = v.iter().map(|e| e.job.clone()).collect();
            jobs.sort();
            jobs.dedup();
            for e in &v {
                *causes.entry(&e.cause).or_default() += 1;
            }
            let mut causes: Vec<(String, usize)> = causes.into_iter().map(|(c, n)| (c.to_string(), n)).collect();
            causes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            Offender {
                node: node.to_string(),
                episodes: v.len(),
                // An episode still open counts to the node's last window (a
                // server too old to say: to now).
                flagged_s: v
                    .iter()
                    .map(|e| (e.end_us.or(e.seen_until_us).unwrap_or(now_us) - e.start_us).max(0) / 1_000_000)
                    .sum(),
                jobs,
                causes,
                gpu_hours: (v.iter().filter_map(|e| e.cost).map(|c| c.gpu_hours).sum::<f64>() * 1000.0).round()
                    / 1000.0,
                usd: v
                    .iter()
                    .map(|e| e.cost.and_then(|c| c.usd))
                    .sum::<Option<f64>>()
                    .map(|d| (d * 100.0).round() / 100.0),
            }
        })
        .collect();
    out.sort_by(|a, b| b.gpu_hours.total_cmp(&a.gpu_hours).then(b.episodes.cmp(&a.episodes)).then(a.node.cmp(&b.node)));
    out
}

/// At most 80 columns: node, episodes, time flagged, GPU-hours, dollars, causes.
pub(crate) fn table(list: &[Offender], episodes: usize, min: u32) -> String {
    let mut o = format!("{:<16} {:>4} {:>9} {:>9} {:>10}  {}\n", "NODE", "EPIS", "FLAGGED", "GPU-H", "COST", "CAUSES");
    if list.is_empty() {
        o.push_str(&format!("no node was flagged {min} times or more ({episodes} episode(s) in the range)\n"));
    }
    for f in list {
        let node = super::columns::fit(&f.node, 16);
        let causes = f.causes.iter().map(|(c, n)| {
            let c = ingero_server::rank::short_label(c);
            if *n > 1 { format!("{c} ×{n}") } else { c.to_string() }
        });
        let causes = super::columns::fit(&causes.collect::<Vec<_>>().join(", "), 26);
        let flagged = humantime::format_duration(std::time::Duration::from_secs(f.flagged_s as u64)).to_string();
        let flagged = flagged.split(' ').take(2).collect::<Vec<_>>().join("");
        let usd = f.usd.map_or("-".to_string(), |d| format!("${d:.2}"));
        o.push_str(&format!("{node:<16} {:>4} {flagged:>9} {:>9.2} {usd:>10}  {causes}\n", f.episodes, f.gpu_hours));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingero_server::rank::cost::Cost;

    fn ep(node: &str, cause: &str, start_s: i64, secs: i64, usd: Option<f64>) -> Episode {
        Episode {
            job: "job-a".into(),
            node: node.into(),
            start_us: start_s * 1_000_000,
            end_us: Some((start_s + secs) * 1_000_000),
            seen_until_us: Some((start_s + secs) * 1_000_000),
            cause: cause.into(),
            text: String::new(),
            peak_score: 9.0,
            lost_s: secs as f64 / 4.0,
            cost: Some(Cost { gpus: 64, gpu_hours: secs as f64 / 4.0 * 64.0 / 3600.0, usd }),
        }
    }

    #[test]
    fn repeat_offenders_are_grouped_costliest_first_within_80_columns() {
        let eps = vec![
            ep("node-7", "runq_share", 0, 600, Some(20.0)),
            ep("node-7", "runq_share", 3600, 1200, Some(40.0)),
            ep("node-7", "io_share", 7200, 300, Some(10.0)),
            ep("gpu-node-with-a-very-long-name-1", "offcpu_share", 0, 3600, None),
            ep("gpu-node-with-a-very-long-name-1", "offcpu_share", 9000, 60, None),
            ep("node-9", "runq_share", 0, 60, Some(1.0)),
        ];
        let list = offenders(&eps, 2, 0);
        assert_eq!(
            list.iter().map(|f| f.node.as_str()).collect::<Vec<_>>(),
            ["gpu-node-with-a-very-long-name-1", "node-7"]
        );
        let n7 = &list[1];
        assert_eq!((n7.episodes, n7.flagged_s, n7.usd), (3, 2100, Some(70.0)));
        assert_eq!(n7.causes, vec![("runq_share".to_string(), 2), ("io_share".to_string(), 1)]);
        assert_eq!(list[0].usd, None, "an unpriced episode leaves the node's dollars unsaid");
        let t = table(&list, eps.len(), 2);
        assert!(t.lines().all(|l| l.chars().count() <= 80), "wider than 80 columns:\n{t}");
        assert!(t.contains("$70.00") && t.contains("run-queue ×2, block IO"), "{t}");
        assert!(table(&[], 1, 2).contains("no node was flagged 2 times or more (1 episode(s)"));
    }

    /// History that ends while a node is flagged: its episode lasts to the
    /// node's last window, however long ago that was, not to now.
    #[test]
    fn an_open_episode_lasts_to_the_nodes_last_window() {
        let open = Episode { end_us: None, ..ep("node-3", "offcpu_share", 100, 20, None) };
        let later_now = 3_600 * 1_000_000;
        assert_eq!(offenders(std::slice::from_ref(&open), 1, later_now)[0].flagged_s, 20);
        let unknown = Episode { seen_until_us: None, ..open };
        assert_eq!(offenders(&[unknown], 1, later_now)[0].flagged_s, 3_500, "an older server's: to now");
    }
}
