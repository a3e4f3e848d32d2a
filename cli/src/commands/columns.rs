// SPDX-License-Identifier: Apache-2.0
//! Text for an 80-column terminal: words wrapped into lines, a cell cut
//! with an ellipsis.

/// Words into lines of at most `w` characters (a longer word, a URL, is cut).
pub(crate) fn wrap(s: &str, w: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in s.split_whitespace() {
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > w {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines.into_iter().map(|l| fit(&l, w)).collect()
}

/// At most `w` characters, an ellipsis marking a cut.
pub(crate) fn fit(s: &str, w: usize) -> String {
    if s.chars().count() <= w { s.to_string() } else { s.chars().take(w - 1).chain(['…']).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_wrap_within_the_width_and_a_long_word_is_cut() {
        assert_eq!(wrap("run-queue wait 35% vs job median 0%", 20), ["run-queue wait 35%", "vs job median 0%"]);
        assert_eq!(wrap(&"x".repeat(30), 10), ["xxxxxxxxx…"]);
        assert!(wrap("", 10).is_empty());
        assert_eq!(fit("host-blocked", 8), "host-bl…");
        assert_eq!(fit("héllo", 5), "héllo");
    }
}
