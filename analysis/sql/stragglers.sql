-- SPDX-License-Identifier: Apache-2.0
-- ingero's fleet history ranking as plain SQL, for engines that read the
-- Delta tables directly (DuckDB, Spark SQL; Trino: see README.md).
--
-- Input: two relations, signal_windows_10s (the 10-second signal tier) and
-- progress_windows (each process's call in flight, per agent window), each
-- holding the range to rank (make them views over the Delta tables filtered
-- to the range). Output: one row per straggler episode in the range (job,
-- node, since, until: null while it lasts, peak score and its cause) with
-- the nodes flagged at the range's end first, most deviant first: the
-- ranking and the episodes `ingero stragglers --since … --resolution 10s
-- --format json` gives, hung ranks (cause `stuck`) included. The one
-- setting is `--stuck-after` (30 s): `stuck_after` below.
--
-- The detector: per 10-s bin and job, each signal of each node against the
-- job's median and scaled MAD (robust z) — in a bin with fewer than 8 judged
-- nodes, against the *other* nodes' (leave-one-out); a node deviates in a bin when a
-- signal's z >= 4 in its bad direction and by at least the signal's least
-- effect; a node's first 2 measured bins are its start-up; a node that only
-- waits less than its peers is the straggler unless another node of the job
-- has a cause of its own; 4 deviant bins in a row flag a node (since the
-- first of them), 5 calm bins in a row clear it.
--
-- Hung ranks: in a bin where a call had been in flight --stuck-after (the
-- tier's in_call_age_ns), each process as it stood at the bin's end; the
-- op most of them have waited in that long; a node some of whose processes
-- do not wait there, while another node's all do, holds the rank they wait
-- for: stuck, flagged at once (score 1000) until progress resumes, and
-- whatever deviated before the hang does not count after it.
WITH stuck_after AS (SELECT CAST(30000000000 AS DOUBLE) AS ns),
bins AS (
  SELECT job, node, window_start AS bin,
         SUM(CAST(window_us AS DOUBLE)) * 1000 AS window_ns,
         SUM(CAST(runq_wait_ns AS DOUBLE)) AS runq_ns,
         SUM(CAST(off_cpu_ns AS DOUBLE)) AS off_ns,
         SUM(CAST(off_cpu_in_call_ns AS DOUBLE)) AS off_call_ns,
         SUM(CAST(on_cpu_ns AS DOUBLE)) AS on_ns,
         SUM(CAST(copy_wait_ns AS DOUBLE)) AS copy_ns,
         SUM(CAST(device_wait_ns AS DOUBLE)) AS wait_ns,
         SUM(CAST(io_ns AS DOUBLE)) AS io_ns,
         SUM(CAST(mem_events AS DOUBLE)) AS mem_events,
         BOOL_OR(measured) AS measured,
         MAX(CAST(in_call_age_ns AS DOUBLE)) AS in_call_age
  FROM signal_windows_10s
  GROUP BY job, node, window_start
),
counted AS (
  SELECT b.*,
         SUM(CASE WHEN measured THEN 1 ELSE 0 END)
           OVER (PARTITION BY job, node ORDER BY bin ROWS UNBOUNDED PRECEDING) AS measured_bins,
         COUNT(*) OVER (PARTITION BY job, bin) AS nodes_in_bin
  FROM bins b
),
judged AS (
  SELECT c.*, COUNT(*) OVER (PARTITION BY job, bin) AS judged_nodes
  FROM counted c
  WHERE measured AND measured_bins > 2 AND nodes_in_bin >= 2
),
specs AS (
  SELECT * FROM (VALUES ('runq_share', 1.0, 0.05, TRUE, 1),
                        ('offcpu_share', 1.0, 0.08, TRUE, 2),
                        ('copy_wait_share', 1.0, 0.05, TRUE, 3),
                        ('io_share', 1.0, 0.05, TRUE, 4),
                        ('mem_events', 1.0, 1.0, TRUE, 5),
                        ('device_wait_share', -1.0, 0.08, FALSE, 6)) AS s (signal, dir, min_effect, cause, ord)
),
vals AS (
  SELECT j.job, j.node, j.bin, j.judged_nodes, s.signal, s.dir, s.min_effect, s.cause, s.ord,
         CASE s.signal
           WHEN 'runq_share' THEN j.runq_ns / GREATEST(j.runq_ns + j.off_ns + j.on_ns, 1)
           WHEN 'offcpu_share' THEN GREATEST(j.off_ns - j.off_call_ns, 0) / GREATEST(j.runq_ns + j.off_ns + j.on_ns, 1)
           WHEN 'copy_wait_share' THEN j.copy_ns / GREATEST(j.window_ns, 1)
           WHEN 'io_share' THEN j.io_ns / GREATEST(j.window_ns, 1)
           WHEN 'mem_events' THEN j.mem_events
           ELSE j.wait_ns / GREATEST(j.window_ns, 1)
         END AS v
  FROM judged j CROSS JOIN specs s
),
-- Each node's signal against its reference: the job's median and MAD in a
-- bin of 8 or more judged nodes, the other nodes' in a smaller one
-- (leave-one-out: each node paired with its peers). Window medians, not
-- joins back to vals, keep the plan small for engines that inline CTEs.
ref1 AS (
  SELECT job, node, bin, signal, dir, min_effect, cause, ord, v, m,
         1.4826 * MEDIAN(ABS(v - m)) OVER (PARTITION BY job, bin, signal) AS mad
  FROM (SELECT v.*, MEDIAN(v) OVER (PARTITION BY job, bin, signal) AS m FROM vals v WHERE judged_nodes >= 8) t
  UNION ALL
  SELECT job, node, bin, signal, dir, min_effect, cause, ord, v, m, 1.4826 * MEDIAN(ABS(ov - m)) AS mad
  FROM (SELECT v.job, v.node, v.bin, v.signal, v.dir, v.min_effect, v.cause, v.ord, v.v, o.v AS ov,
               MEDIAN(o.v) OVER (PARTITION BY v.job, v.node, v.bin, v.signal) AS m
        FROM vals v JOIN vals o ON o.job = v.job AND o.bin = v.bin AND o.signal = v.signal AND o.node <> v.node
        WHERE v.judged_nodes < 8) p
  GROUP BY job, node, bin, signal, dir, min_effect, cause, ord, v, m
),
dev1 AS (
  SELECT job, node, bin, signal, cause, ord,
         dir * (v - m) / GREATEST(mad, min_effect / 4.0, 0.1 * ABS(m)) AS z,
         dir * (v - m) >= min_effect AS big_enough
  FROM ref1
),
first_pass AS (
  SELECT job, node, bin,
         MAX(CASE WHEN signal = 'device_wait_share' THEN 1 ELSE 0 END) AS waits_less,
         MAX(CASE WHEN cause THEN 1 ELSE 0 END) AS has_cause
  FROM dev1 WHERE z >= 4.0 AND big_enough
  GROUP BY job, node, bin
),
-- A slow link: waiting *more* on the device and peers than the nodes that
-- neither wait less nor have a cause of their own.
vals2 AS (
  SELECT j.job, j.node, j.bin, j.wait_ns / GREATEST(j.window_ns, 1) AS v,
         COUNT(*) OVER (PARTITION BY j.job, j.bin) AS n
  FROM judged j
  LEFT JOIN first_pass f ON j.job = f.job AND j.node = f.node AND j.bin = f.bin
  WHERE f.node IS NULL
),
ref2 AS (
  SELECT job, node, bin, v, m, 1.4826 * MEDIAN(ABS(v - m)) OVER (PARTITION BY job, bin) AS mad
  FROM (SELECT v.*, MEDIAN(v) OVER (PARTITION BY job, bin) AS m FROM vals2 v WHERE n >= 8) t
  UNION ALL
  SELECT job, node, bin, v, m, 1.4826 * MEDIAN(ABS(ov - m)) AS mad
  FROM (SELECT v.job, v.node, v.bin, v.v, o.v AS ov, MEDIAN(o.v) OVER (PARTITION BY v.job, v.node, v.bin) AS m
        FROM vals2 v JOIN vals2 o ON o.job = v.job AND o.bin = v.bin AND o.node <> v.node
        WHERE v.n < 8) p
  GROUP BY job, node, bin, v, m
),
dev2 AS (
  SELECT job, node, bin, 'device_wait_share_high' AS signal, TRUE AS cause, 7 AS ord,
         (v - m) / GREATEST(mad, 0.08 / 4.0, 0.1 * ABS(m)) AS z,
         v - m >= 0.08 AS big_enough
  FROM ref2
),
devs AS (
  SELECT job, node, bin, signal, cause, ord, ROUND(z, 1) AS z FROM dev1 WHERE z >= 4.0 AND big_enough
  UNION ALL
  SELECT job, node, bin, signal, cause, ord, ROUND(z, 1) AS z FROM dev2 WHERE z >= 4.0 AND big_enough
),
scored AS (
  SELECT job, node, bin, MAX(z) AS score, MAX(CASE WHEN cause THEN 1 ELSE 0 END) AS has_cause
  FROM devs GROUP BY job, node, bin
),
-- Deviant bins: a node that only waits less is the straggler unless a node
-- of its job has a cause of its own in that bin.
deviant AS (
  SELECT job, node, bin, score
  FROM (SELECT s.*, MAX(has_cause) OVER (PARTITION BY job, bin) AS any_cause FROM scored s) t
  WHERE has_cause = 1 OR any_cause = 0
),
-- Hung ranks: the nodes of each job-bin where a call had been in flight that
-- long, and each of their processes as it stood at the bin's end (its
-- newest row). Each CTE below is read once: engines that inline CTEs
-- (Spark) would otherwise plan this part many times over.
hot AS (
  SELECT job, node, bin
  FROM (SELECT c.job, c.node, c.bin, c.nodes_in_bin,
               MAX(c.in_call_age) OVER (PARTITION BY c.job, c.bin) AS job_age FROM counted c) t, stuck_after a
  WHERE nodes_in_bin >= 2 AND job_age >= a.ns
),
procs AS (
  SELECT t.job, t.node, t.bin, t.op, t.age,
         CASE WHEN t.op IS NOT NULL AND t.age >= a.ns THEN t.op END AS waits_in
  FROM (SELECT h.job, h.node, h.bin, p.oldest_op AS op, CAST(p.oldest_age_ns AS DOUBLE) AS age,
               ROW_NUMBER() OVER (PARTITION BY h.job, h.node, h.bin, p.pid ORDER BY p.window_start DESC) AS r
        FROM progress_windows p
        JOIN hot h ON COALESCE(p.job, '(unlabelled)') = h.job AND p.node = h.node
         AND p.window_start >= h.bin AND p.window_start < h.bin + INTERVAL '10' SECOND) t, stuck_after a
  WHERE t.r = 1
),
-- The op most processes have waited in that long (a tie: the op named last).
waited AS (
  SELECT p.*, FIRST_VALUE(waits_in) OVER (PARTITION BY job, bin ORDER BY CASE WHEN waits_in IS NULL THEN 1 ELSE 0 END,
                                                                        n DESC, waits_in DESC) AS top_op
  FROM (SELECT p.*, COUNT(*) OVER (PARTITION BY job, bin, waits_in) AS n FROM procs p) p
),
node_waits AS (
  SELECT job, node, bin, MIN(CASE WHEN waits_in = top_op THEN 1 ELSE 0 END) = 1 AS waiting
  FROM waited WHERE top_op IS NOT NULL
  GROUP BY job, node, bin
),
-- The nodes holding a rank the others wait for.
stuck AS (
  SELECT job, node, bin
  FROM (SELECT n.*, MAX(CASE WHEN waiting THEN 1 ELSE 0 END) OVER (PARTITION BY job, bin) AS any_waiting
        FROM node_waits n) t
  WHERE NOT waiting AND any_waiting = 1
),
-- Every bin each node was judged in (a bin with one node is not), stuck,
-- deviant or calm, numbered in order; a hang starts a new segment.
states AS (
  SELECT s.*, SUM(CASE WHEN is_stuck THEN 1 ELSE 0 END)
                OVER (PARTITION BY job, node ORDER BY k ROWS UNBOUNDED PRECEDING) AS seg
  FROM (SELECT c.job, c.node, c.bin, h.node IS NOT NULL AS is_stuck,
               h.node IS NULL AND d.node IS NOT NULL AS is_deviant,
               CASE WHEN h.node IS NOT NULL THEN 1000.0 ELSE d.score END AS score,
               ROW_NUMBER() OVER (PARTITION BY c.job, c.node ORDER BY c.bin) AS k
        FROM counted c
        LEFT JOIN deviant d ON c.job = d.job AND c.node = d.node AND c.bin = d.bin
        LEFT JOIN stuck h ON c.job = h.job AND c.node = h.node AND c.bin = h.bin
        WHERE c.nodes_in_bin >= 2) s
),
-- Runs of deviant or of calm bins within a segment (gaps and islands), and
-- each bin's place in its run. From here on each CTE is read once.
runs AS (
  SELECT i.*, ROW_NUMBER() OVER (PARTITION BY job, node, seg, is_stuck, is_deviant, island ORDER BY k) AS pos,
         MIN(bin) OVER (PARTITION BY job, node, seg, is_stuck, is_deviant, island) AS run_start
  FROM (SELECT s.*, k - ROW_NUMBER() OVER (PARTITION BY job, node, seg, is_stuck, is_deviant ORDER BY k) AS island
        FROM states s) i
),
-- A deviant run flags a node at its 4th bin (since the run's first, unless
-- the node is flagged already); a calm run clears it at its 5th. The node
-- is flagged in a bin when stuck, or when the last of these events of its
-- segment up to it opened (a segment starts unflagged: progress resumed).
marked AS (
  SELECT r.*, CASE WHEN is_stuck THEN bin WHEN opens THEN run_start END AS opened_run,
         COUNT(opens) OVER (PARTITION BY job, node, seg ORDER BY k ROWS UNBOUNDED PRECEDING) AS grp
  FROM (SELECT r.*, CASE WHEN is_stuck THEN NULL WHEN is_deviant AND pos = 4 THEN TRUE
                         WHEN NOT is_deviant AND pos = 5 THEN FALSE END AS opens
        FROM runs r) r
),
flags AS (
  SELECT m.*, is_stuck OR MAX(CASE WHEN opens THEN 1 ELSE 0 END) OVER (PARTITION BY job, node, seg, grp) = 1 AS flagged
  FROM marked m
),
-- Episodes: numbered where a node becomes flagged. Per bin, the next bin
-- (the one that clears an episode ends it), and what the node stands at in
-- its last bin: flagged or not, and its score (that of its last deviant or
-- stuck bin).
numbered AS (
  SELECT f.*,
         SUM(CASE WHEN flagged AND NOT COALESCE(prev_flagged, FALSE) THEN 1 ELSE 0 END)
           OVER (PARTITION BY job, node ORDER BY k ROWS UNBOUNDED PRECEDING) AS episode,
         LEAD(bin) OVER (PARTITION BY job, node ORDER BY k) AS next_bin,
         FIRST_VALUE(flagged) OVER (PARTITION BY job, node ORDER BY k DESC) AS flagged_last,
         FIRST_VALUE(score) OVER (PARTITION BY job, node
                                  ORDER BY CASE WHEN is_deviant OR is_stuck THEN 0 ELSE 1 END, k DESC) AS score_last
  FROM (SELECT f.*, LAG(flagged) OVER (PARTITION BY job, node ORDER BY k) AS prev_flagged FROM flags f) f
),
-- Each flagged bin with its episode's last bin, and its rank for the
-- episode's peak: the highest score while flagged (the later bin on a tie).
flagged_bins AS (
  SELECT n.*, MAX(k) OVER (PARTITION BY job, node, episode) AS last_k,
         ROW_NUMBER() OVER (PARTITION BY job, node, episode
                            ORDER BY CASE WHEN is_deviant OR is_stuck THEN 0 ELSE 1 END, score DESC, k DESC) AS peak_r
  FROM numbered n WHERE flagged
),
-- Each bin's top deviation (the detector's order breaks ties: the later wins).
tops AS (
  SELECT job, node, bin, signal,
         ROW_NUMBER() OVER (PARTITION BY job, node, bin ORDER BY z DESC, ord DESC) AS r
  FROM devs
),
-- One row per episode; the peak bin's top signal is its cause (`stuck`
-- while hung).
episodes AS (
  SELECT f.job, f.node, MIN(f.opened_run) AS since,
         MAX(CASE WHEN f.k = f.last_k THEN f.next_bin + INTERVAL '10' SECOND END) AS until,
         MAX(CASE WHEN f.peak_r = 1 THEN f.score END) AS peak_score,
         MAX(CASE WHEN f.peak_r = 1 THEN CASE WHEN f.is_stuck THEN 'stuck' ELSE t.signal END END) AS cause,
         BOOL_OR(f.flagged_last) AS flagged_last, MAX(f.score_last) AS score_last
  FROM flagged_bins f LEFT JOIN tops t ON t.job = f.job AND t.node = f.node AND t.bin = f.bin AND t.r = 1
  GROUP BY f.job, f.node, f.episode
)
-- The nodes flagged at the range's end first, most deviant first (`ingero
-- stragglers`' order), then the closed episodes.
SELECT job, node, since, until, peak_score, cause,
       until IS NULL AND flagged_last AS flagged_now,
       CASE WHEN until IS NULL AND flagged_last THEN score_last END AS score_now
FROM episodes
ORDER BY flagged_now DESC, score_now DESC, node, since
