// SPDX-License-Identifier: Apache-2.0
//! HTML escaping, shared by the page, the flame graph and the fleet view (a
//! leaf, so that none of them imports another for it).

/// Text made safe inside HTML elements and quoted attributes.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}
