// SPDX-License-Identifier: Apache-2.0
//! The line a CPython frame is executing, from its code object's line
//! table: the instruction offset decoded with the format of the
//! interpreter's version (`co_lnotab` in 3.9, PEP 626's `co_linetable` in
//! 3.10, the location table of 3.11+). Mirrors `PyCode_Addr2Line`.

/// Which line table format a code object carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// 3.9 `co_lnotab`: (byte increment, signed line increment) pairs.
    Lnotab,
    /// 3.10 `co_linetable`: (byte delta, signed line delta, -128 = none) pairs.
    Pep626,
    /// 3.11+ location table: varint-coded entries over code units.
    Locations,
}

/// The line of the instruction at `byte_offset` into the bytecode; None
/// when the table says the instruction has no line (or the table is cut).
pub(crate) fn line_at(format: Format, table: &[u8], first_line: u32, byte_offset: u64) -> Option<u32> {
    let line = match format {
        Format::Lnotab => lnotab(table, first_line as i64, byte_offset),
        Format::Pep626 => pep626(table, first_line as i64, byte_offset),
        Format::Locations => locations(table, first_line as i64, byte_offset / 2),
    }?;
    u32::try_from(line).ok().filter(|&l| l > 0)
}

fn lnotab(t: &[u8], mut line: i64, addr: u64) -> Option<i64> {
    let mut at = 0u64;
    for pair in t.chunks_exact(2) {
        at += pair[0] as u64;
        if at > addr {
            break;
        }
        line += pair[1] as i8 as i64;
    }
    Some(line)
}

fn pep626(t: &[u8], mut line: i64, addr: u64) -> Option<i64> {
    let mut start = 0u64;
    for pair in t.chunks_exact(2) {
        let end = start + pair[0] as u64;
        let delta = pair[1] as i8;
        let current = (delta != -128).then(|| {
            line += delta as i64;
            line
        });
        if start <= addr && addr < end {
            return current;
        }
        start = end;
    }
    None
}

/// 3.11+: each entry starts with a byte whose top bit is set: code in bits
/// 3-6, length - 1 (code units) in bits 0-2.
fn locations(t: &[u8], mut line: i64, unit: u64) -> Option<i64> {
    let mut r = Reader { t, at: 0 };
    let mut start = 0u64;
    while let Some(first) = r.byte() {
        if first & 0x80 == 0 {
            return None; // not at an entry start: a corrupt or cut table
        }
        let code = (first >> 3) & 15;
        let end = start + (first & 7) as u64 + 1;
        let this = match code {
            15 => None, // no location
            14 => {
                line += r.svarint()?;
                r.varint()?; // end line delta
                r.varint()?; // column + 1
                r.varint()?; // end column + 1
                Some(line)
            }
            13 => {
                line += r.svarint()?; // no column
                Some(line)
            }
            10..=12 => {
                line += (code - 10) as i64;
                r.byte()?;
                r.byte()?;
                Some(line)
            }
            _ => {
                r.byte()?; // short form: same line, one column byte
                Some(line)
            }
        };
        if start <= unit && unit < end {
            return this;
        }
        start = end;
    }
    None
}

struct Reader<'a> {
    t: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.t.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    /// 6 bits per byte, bit 6 = more.
    fn varint(&mut self) -> Option<u64> {
        let mut b = self.byte()?;
        let mut v = (b & 63) as u64;
        let mut shift = 6;
        while b & 64 != 0 && shift < 64 {
            b = self.byte()?;
            v |= ((b & 63) as u64) << shift;
            shift += 6;
        }
        Some(v)
    }

    fn svarint(&mut self) -> Option<i64> {
        let v = self.varint()?;
        Some(if v & 1 != 0 { -((v >> 1) as i64) } else { (v >> 1) as i64 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_by_hand() {
        // 3.9: line 10; +6 bytes → 11; +4 bytes, -1 → 10.
        let t = [6u8, 1, 4, 0xff];
        assert_eq!(line_at(Format::Lnotab, &t, 10, 0), Some(10));
        assert_eq!(line_at(Format::Lnotab, &t, 10, 6), Some(11));
        assert_eq!(line_at(Format::Lnotab, &t, 10, 10), Some(10));
        // 3.10: [0,4) line 11, [4,8) no line, [8,12) line 13.
        let t = [4u8, 1, 4, 0x80, 4, 2];
        assert_eq!(line_at(Format::Pep626, &t, 10, 2), Some(11));
        assert_eq!(line_at(Format::Pep626, &t, 10, 4), None);
        assert_eq!(line_at(Format::Pep626, &t, 10, 8), Some(13));
        // 3.11: one-line form +1 over 2 units, no-column +3 over 1, long form -2.
        let t = [0x80 | (11 << 3) | 1, 4, 9, 0x80 | (13 << 3), 6, 0x80 | (14 << 3) | 2, 5, 0, 1, 1];
        assert_eq!(line_at(Format::Locations, &t, 20, 0), Some(21));
        assert_eq!(line_at(Format::Locations, &t, 20, 2), Some(21));
        assert_eq!(line_at(Format::Locations, &t, 20, 4), Some(24));
        assert_eq!(line_at(Format::Locations, &t, 20, 8), Some(22));
        assert_eq!(line_at(Format::Locations, &t, 20, 100), None);
        assert_eq!(line_at(Format::Locations, &[0x05], 1, 0), None, "not an entry start");
    }

    /// The decoder against each installed CPython's own answer for every
    /// instruction of a function (`dis`), CPython 3.9–3.13 (pyenv).
    #[test]
    fn matches_every_interpreter() {
        for v in crate::stacks::python::TESTED {
            let out = crate::stacks::python::tests::run_python(v, DUMP);
            let mut lines = out.lines();
            let first: u32 = lines.next().unwrap().parse().unwrap();
            let table = hex(lines.next().unwrap());
            let format = crate::stacks::python::Version::parse(v).unwrap().line_format();
            let mut checked = 0;
            for l in lines {
                let (off, line) = l.split_once(' ').unwrap();
                let want = line.parse::<u32>().ok();
                let got = line_at(format, &table, first, off.parse().unwrap());
                assert_eq!(got, want, "python {v}, offset {off}");
                checked += 1;
            }
            assert!(checked > 20, "python {v}: {checked} instructions");
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// Prints first line, the raw table, then `offset line` per instruction.
    const DUMP: &str = r#"
import dis, sys
def f(x):
    y = x + 1

    if y > 2:
        for i in range(3):
            y += i * (
                2)
    try:
        z = [a for a in range(y)]
    except Exception:
        z = None
    return (y,
            z)
c = f.__code__
t = c.co_linetable if sys.version_info >= (3, 10) else c.co_lnotab
print(c.co_firstlineno)
print(t.hex())
if sys.version_info >= (3, 10):
    spans = list(c.co_lines())
else:
    starts = list(dis.findlinestarts(c)) + [(len(c.co_code), None)]
    spans = [(a, b, l) for (a, l), (b, _) in zip(starts, starts[1:])]
for off in range(0, len(c.co_code), 2):
    line = next((l for a, b, l in spans if a <= off < b), None)
    print(off, "none" if line is None else line)
"#;
}
