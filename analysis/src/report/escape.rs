// SPDX-License-Identifier: Apache-2.0
//! HTML escaping for the hand-built SVG and tables of the flame graph; the
//! pages themselves are maud templates, which escape what they splice.

/// Text made safe inside HTML elements and quoted attributes.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}
