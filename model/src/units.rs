// SPDX-License-Identifier: Apache-2.0
//! Human sizes on the command line (`64MiB`), shared by every binary.

/// Parses `123`, `64KiB`, `256MiB`, `2GiB` (also `k`, `MB`, …, powers of 1024).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().map_err(|_| format!("`{s}` is not a size (e.g. 64MiB)"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown size unit `{other}` in `{s}` (use B, KiB, MiB or GiB)")),
    };
    n.checked_mul(mult).filter(|&v| v > 0).ok_or_else(|| format!("`{s}` is out of range"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(super::parse_bytes("7"), Ok(7));
        assert!(super::parse_bytes("0").is_err());
        assert!(super::parse_bytes("3 parsecs").is_err());
    }
}
