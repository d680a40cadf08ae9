//! Path globs of `file:` resources, and whether two of them can match a common path.
//!
//! A glob is a `/`-separated list of segments, relative to the shared working tree:
//!
//! - a segment `**` matches zero or more whole segments (`docs/**` matches `docs`,
//!   `docs/a` and `docs/a/b`);
//! - in any other segment, `*` matches any run of characters (possibly none) and `?`
//!   exactly one character, never `/`; every other character matches itself
//!   (case-sensitive, by Unicode scalar value). A `*` also matches a leading dot:
//!   there are no hidden files.
//! - `[`, `]`, `{`, `}` and `\` are refused (no classes, alternation or escapes):
//!   list several resources instead. Empty segments, `.` and `..`, a leading or
//!   trailing `/` and control characters are refused too.
//!
//! Globs are kept in a canonical text ([`Glob::as_str`]): a run of `*` inside a
//! segment is one `*`, a segment of only stars (two or more) is `**`, and `**/**` is
//! `**`. Two spellings of one glob are one resource.
//!
//! **Overlap** ([`Glob::overlaps`]) is exact: it is true exactly when some path matches
//! both globs. It decides the emptiness of the intersection of the two patterns (a
//! product of their automata, by dynamic programming over positions): at the level of
//! segments, where `**` is the only repetition, then, for two plain segments, at the
//! level of characters, where `*` is the only repetition. So it is sound (it never
//! answers "no overlap" for two globs that match a common path) and never reports an
//! overlap that no path has. The Postgres backend runs the same algorithm in SQL
//! (migration 0007), on the canonical text.

use std::fmt;

/// The longest glob text, in bytes.
pub const MAX_GLOB_BYTES: usize = 1024;

/// One character position of a segment pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    /// A literal character.
    Lit(char),
    /// `?`: any one character.
    One,
    /// `*`: any run of characters.
    Star,
}

/// One segment of a glob.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    /// `**`: zero or more whole segments.
    AnyDepth,
    /// A segment pattern.
    Pat(Vec<Tok>),
}

/// A parsed, canonical path glob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    text: String,
    segs: Vec<Seg>,
}

/// Why a glob was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("path glob {glob:?} {reason}")]
pub struct GlobError {
    /// The text given.
    pub glob: String,
    /// What is wrong with it, and what to write instead.
    pub reason: String,
}

impl Glob {
    /// Parses `text` into its canonical form, or says what is wrong with it.
    pub fn parse(text: &str) -> Result<Glob, GlobError> {
        let bad = |reason: &str| GlobError {
            glob: text.to_string(),
            reason: reason.to_string(),
        };
        if text.is_empty() {
            return Err(bad("is empty"));
        }
        if text.len() > MAX_GLOB_BYTES {
            return Err(bad(&format!("is longer than {MAX_GLOB_BYTES} bytes")));
        }
        if text.starts_with('/') {
            return Err(bad(
                "starts with '/': paths are relative to the shared working tree",
            ));
        }
        if text.ends_with('/') {
            return Err(bad(
                "ends with '/': write DIR/** for a directory and everything in it",
            ));
        }
        if let Some(c) = text
            .chars()
            .find(|c| c.is_control() || matches!(c, '[' | ']' | '{' | '}' | '\\'))
        {
            return Err(bad(&format!(
                "contains {c:?}: only `*`, `?` and `**` are wildcards (no classes, alternation or escapes); list several resources instead"
            )));
        }
        let mut segs: Vec<Seg> = Vec::new();
        for part in text.split('/') {
            match part {
                "" => return Err(bad("has an empty segment ('//')")),
                "." | ".." => {
                    return Err(bad(
                        "has a '.' or '..' segment: name the path as the repository shows it",
                    ))
                }
                _ => {}
            }
            if part.len() >= 2 && part.chars().all(|c| c == '*') {
                if segs.last() != Some(&Seg::AnyDepth) {
                    segs.push(Seg::AnyDepth);
                }
                continue;
            }
            let mut toks = Vec::with_capacity(part.len());
            for c in part.chars() {
                let t = match c {
                    '*' => Tok::Star,
                    '?' => Tok::One,
                    c => Tok::Lit(c),
                };
                if t == Tok::Star && toks.last() == Some(&Tok::Star) {
                    continue;
                }
                toks.push(t);
            }
            segs.push(Seg::Pat(toks));
        }
        let text = render(&segs);
        Ok(Glob { text, segs })
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the glob has no wildcard: it names one path.
    pub fn is_literal(&self) -> bool {
        self.segs.iter().all(|s| match s {
            Seg::AnyDepth => false,
            Seg::Pat(toks) => toks.iter().all(|t| matches!(t, Tok::Lit(_))),
        })
    }

    /// Whether some path matches both `self` and `other`.
    pub fn overlaps(&self, other: &Glob) -> bool {
        intersects(
            &self.segs,
            &other.segs,
            |s| *s == Seg::AnyDepth,
            |a, b| match (a, b) {
                (Seg::Pat(x), Seg::Pat(y)) => segments_overlap(x, y),
                _ => true,
            },
        )
    }

    /// Whether `path` (a repository-relative path as git prints it, every character
    /// literal) matches the glob.
    pub fn matches(&self, path: &str) -> bool {
        let path: Vec<Seg> = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| Seg::Pat(s.chars().map(Tok::Lit).collect()))
            .collect();
        if path.is_empty() {
            return false;
        }
        intersects(
            &self.segs,
            &path,
            |s| *s == Seg::AnyDepth,
            |a, b| match (a, b) {
                (Seg::Pat(x), Seg::Pat(y)) => segments_overlap(x, y),
                _ => true,
            },
        )
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn render(segs: &[Seg]) -> String {
    let parts: Vec<String> = segs
        .iter()
        .map(|s| match s {
            Seg::AnyDepth => "**".to_string(),
            Seg::Pat(toks) => toks
                .iter()
                .map(|t| match t {
                    Tok::Lit(c) => *c,
                    Tok::One => '?',
                    Tok::Star => '*',
                })
                .collect(),
        })
        .collect();
    parts.join("/")
}

/// Whether two segment patterns match a common string of characters.
fn segments_overlap(a: &[Tok], b: &[Tok]) -> bool {
    intersects(
        a,
        b,
        |t| *t == Tok::Star,
        |x, y| match (x, y) {
            (Tok::Lit(p), Tok::Lit(q)) => p == q,
            _ => true,
        },
    )
}

/// Whether two patterns over items share a word: `star` items match any run of
/// items (possibly none); two non-star items can stand for one common item when
/// `compatible`. Bottom-up over `(i, j)`, the positions reached in each pattern:
/// `ok(i, j)` says the rests `a[i..]` and `b[j..]` share a word. A star may match
/// nothing (skip it) or absorb the other pattern's next non-star item; two stars
/// absorbing the same item stay where they are, which adds nothing.
///
/// A star never needs to match an empty word for a *non-empty* common word to exist
/// where a common word exists: where only the empty word is common, both rests are
/// stars only, and these match every word too. So the answer is also whether a
/// common non-empty segment, or a common non-empty path, exists.
fn intersects<T>(
    a: &[T],
    b: &[T],
    star: impl Fn(&T) -> bool,
    compatible: impl Fn(&T, &T) -> bool,
) -> bool {
    let (n, m) = (a.len(), b.len());
    let w = m + 1;
    let mut ok = vec![false; (n + 1) * w];
    for i in (0..=n).rev() {
        for j in (0..=m).rev() {
            let v = if i == n && j == m {
                true
            } else {
                (i < n && star(&a[i]) && ok[(i + 1) * w + j])
                    || (j < m && star(&b[j]) && ok[i * w + j + 1])
                    || (i < n
                        && j < m
                        && match (star(&a[i]), star(&b[j])) {
                            (true, false) => ok[i * w + j + 1],
                            (false, true) => ok[(i + 1) * w + j],
                            (false, false) => compatible(&a[i], &b[j]) && ok[(i + 1) * w + j + 1],
                            (true, true) => false,
                        })
            };
            ok[i * w + j] = v;
        }
    }
    ok[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn g(s: &str) -> Glob {
        Glob::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn canonical_text() {
        assert_eq!(g("src/***/a**b.rs").as_str(), "src/**/a*b.rs");
        assert_eq!(g("**/**/x").as_str(), "**/x");
        assert_eq!(g("a/**/**").as_str(), "a/**");
        assert!(g("src/main.rs").is_literal());
        assert!(!g("src/*.rs").is_literal());
        for bad in [
            "", "/abs", "dir/", "a//b", "./a", "a/../b", "a[bc]", "{a,b}", "a\\*", "a\tb",
        ] {
            assert!(Glob::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn matching() {
        assert!(g("docs/**").matches("docs"));
        assert!(g("docs/**").matches("docs/a/b.md"));
        assert!(!g("docs/**").matches("docsx/a"));
        assert!(g("src/**/*.rs").matches("src/main.rs"));
        assert!(g("src/**/*.rs").matches("src/a/b/c.rs"));
        assert!(!g("src/**/*.rs").matches("src/a/b/c.md"));
        assert!(g("*").matches(".hidden"));
        assert!(!g("*").matches("a/b"));
        assert!(g("a?c").matches("abc"));
        assert!(!g("a?c").matches("ac"));
        // Path characters are literal: a file named `*` matches only globs that match it.
        assert!(!g("a").matches("*"));
        assert!(g("?").matches("*"));
    }

    #[test]
    fn overlap_cases() {
        let yes = [
            ("src/**/*.rs", "src/main.rs"),
            ("src/**", "**/*.rs"),
            ("src/**/*.rs", "src/a/**"),
            ("*.rs", "main.*"),
            ("a*", "*b"),
            ("**", "x/y/z"),
            ("a/**/b", "a/b"),
            ("a/*/b", "a/**/b"),
            ("?", "*"),
            ("x*y*z", "*y*"),
        ];
        let no = [
            ("src/**/*.rs", "src/**/*.md"),
            ("src/**", "docs/**"),
            ("a/*/b", "a/b"),
            ("*.rs", "*.md"),
            ("a?", "a"),
            ("a/*", "a/b/c"),
            ("ab*", "ac*"),
        ];
        for (x, y) in yes {
            assert!(g(x).overlaps(&g(y)), "{x} and {y} share a path");
            assert!(g(y).overlaps(&g(x)), "{y} and {x} share a path");
        }
        for (x, y) in no {
            assert!(!g(x).overlaps(&g(y)), "{x} and {y} share no path");
            assert!(!g(y).overlaps(&g(x)), "{y} and {x} share no path");
        }
    }

    /// Globs and paths over a small alphabet, so that they often meet.
    fn glob_text() -> impl Strategy<Value = String> {
        let seg = prop_oneof![
            Just("**".to_string()),
            "[ab?*]{1,3}".prop_map(|s| s),
            "[ab]{1,2}".prop_map(|s| s),
        ];
        prop::collection::vec(seg, 1..4).prop_map(|v| v.join("/"))
    }

    fn path_text() -> impl Strategy<Value = String> {
        prop::collection::vec("[ab]{1,3}", 1..5).prop_map(|v| v.join("/"))
    }

    proptest! {
        /// Sound: a path matching both means they overlap.
        #[test]
        fn a_common_path_means_overlap(x in glob_text(), y in glob_text(), p in path_text()) {
            let (x, y) = (g(&x), g(&y));
            if x.matches(&p) && y.matches(&p) {
                prop_assert!(x.overlaps(&y), "{x} and {y} both match {p}");
            }
        }

        /// Symmetric, reflexive, and a literal glob overlaps exactly the globs that
        /// match its path.
        #[test]
        fn overlap_is_symmetric_and_exact_on_literals(x in glob_text(), y in glob_text(), p in path_text()) {
            let (x, y, lit) = (g(&x), g(&y), g(&p));
            prop_assert_eq!(x.overlaps(&y), y.overlaps(&x));
            prop_assert!(x.overlaps(&x));
            prop_assert_eq!(x.overlaps(&lit), x.matches(&p));
        }

        /// Exact: when two globs overlap, some path matches both. Small globs (at most
        /// two segments of at most two tokens over `a`) share a path only if they
        /// share one of at most four segments of at most two letters from `ab`, so
        /// the search below is complete for them.
        #[test]
        fn an_overlap_has_a_witness(x in small_glob(), y in small_glob()) {
            let (x, y) = (g(&x), g(&y));
            let witness = witnesses().into_iter().find(|p| x.matches(p) && y.matches(p));
            prop_assert_eq!(x.overlaps(&y), witness.is_some(), "{} and {}: witness {:?}", x, y, witness);
        }
    }

    fn small_glob() -> impl Strategy<Value = String> {
        let seg = prop_oneof![Just("**".to_string()), "[a?*]{1,2}".prop_map(|s| s)];
        prop::collection::vec(seg, 1..3).prop_map(|v| v.join("/"))
    }

    /// Every path of one to four segments, each a word of one or two letters from `ab`.
    fn witnesses() -> Vec<String> {
        let words = ["a", "b", "aa", "ab", "ba", "bb"];
        let mut out = Vec::new();
        let mut level: Vec<String> = vec![String::new()];
        for _ in 0..4 {
            level = level
                .iter()
                .flat_map(|p| {
                    words.map(|w| {
                        if p.is_empty() {
                            w.to_string()
                        } else {
                            format!("{p}/{w}")
                        }
                    })
                })
                .collect();
            out.extend(level.iter().cloned());
        }
        out
    }
}
