// SPDX-License-Identifier: Apache-2.0
//! Job identity from the process environment (torchrun/DDP variables).

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct JobEnv {
    pub rank: Option<i32>,
    pub local_rank: Option<i32>,
    pub world_size: Option<i32>,
    /// MASTER_ADDR:MASTER_PORT: the same for every rank of one job.
    pub master: Option<String>,
}

pub(crate) fn parse(environ: &[u8]) -> JobEnv {
    let mut e = JobEnv::default();
    let (mut addr, mut port) = (None, None);
    for kv in environ.split(|&b| b == 0) {
        let Ok(kv) = std::str::from_utf8(kv) else { continue };
        let Some((k, v)) = kv.split_once('=') else { continue };
        match k {
            "RANK" => e.rank = v.parse().ok(),
            "LOCAL_RANK" => e.local_rank = v.parse().ok(),
            "WORLD_SIZE" => e.world_size = v.parse().ok(),
            "MASTER_ADDR" => addr = Some(v.to_string()),
            "MASTER_PORT" => port = Some(v.to_string()),
            _ => {}
        }
    }
    e.master = addr.map(|a| match port {
        Some(p) => format!("{a}:{p}"),
        None => a,
    });
    e
}

pub(crate) fn of_pid(pid: u32) -> JobEnv {
    crate::podfs::read_capped(format!("/proc/{pid}/environ"), crate::podfs::MAX_ENVIRON)
        .map(|b| parse(&b))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_torchrun_variables() {
        let e = parse(b"PATH=/bin\0RANK=3\0LOCAL_RANK=1\0WORLD_SIZE=8\0MASTER_ADDR=10.0.0.1\0MASTER_PORT=29500\0");
        assert_eq!(
            e,
            JobEnv { rank: Some(3), local_rank: Some(1), world_size: Some(8), master: Some("10.0.0.1:29500".into()) }
        );
        assert_eq!(parse(b"RANK=x\0"), JobEnv::default());
    }
}
