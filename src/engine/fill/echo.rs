//! The echo source: a growing k-gram index over one request's tokens (prompt, then everything
//! that enters the sequence), proposing what followed the last k tokens the times they occurred
//! before. Edits and refactors repeat long runs of their input, so a model asked to rewrite a
//! block of code mostly re-emits tokens already in its context.
//!
//! A match says where this k-gram occurred, not how far the future agrees with the past: a span
//! grows only while every nearby occurrence continues the same way, and stops where two of them
//! disagree (a fork in the history: the point the model must decide for itself).
use std::collections::{HashMap, HashSet};

use super::{Origin, Policy, Proposal};

/// A sequence and, for each k-gram in it, where it starts (oldest first). Keys are a hash of the
/// k-gram; candidates are compared id for id before use, so collisions only cost a compare.
pub struct EchoIndex {
    k: usize,
    limit: usize,
    seq: Vec<u32>,
    starts: HashMap<u64, Vec<u32>>,
}

impl EchoIndex {
    pub fn new(k: usize, limit: usize) -> Self {
        EchoIndex { k: k.max(1), limit: limit.max(k), seq: Vec::new(), starts: HashMap::new() }
    }

    /// Appends tokens; past `limit` tokens the index stops growing (its memory stays bounded).
    pub fn append(&mut self, ids: &[u32]) {
        for &id in ids {
            if self.seq.len() >= self.limit {
                return;
            }
            self.seq.push(id);
            if let Some(start) = self.seq.len().checked_sub(self.k) {
                let h = hash(&self.seq[start..]);
                self.starts.entry(h).or_default().push(start as u32);
            }
        }
    }

    /// Starts of earlier occurrences of `gram` that have a token after them, nearest first, at
    /// most `cap` of them (recency is the signal, and the cap bounds the scan).
    pub fn candidates(&self, gram: &[u32], cap: usize) -> Vec<usize> {
        if gram.len() != self.k {
            return Vec::new();
        }
        let Some(bucket) = self.starts.get(&hash(gram)) else { return Vec::new() };
        bucket
            .iter()
            .rev()
            .map(|&s| s as usize)
            .filter(|&s| s + self.k < self.seq.len() && &self.seq[s..s + self.k] == gram)
            .take(cap)
            .collect()
    }

    /// The continuation every anchor agrees on, at most `max_span` tokens, ending at the first
    /// delimiter; whether it stopped at a fork; and how many occurrences carried the whole span.
    /// An occurrence that runs out of history drops out: a prefix that ends is no disagreement.
    pub fn extend(&self, anchors: &[usize], max_span: usize, delimiters: &HashSet<u32>) -> (Vec<u32>, bool, usize) {
        let mut ids = Vec::new();
        let mut agreed = 0;
        let mut live: Vec<usize> = anchors.iter().map(|&p| p + self.k).collect();
        while ids.len() < max_span {
            let mut next = None;
            let mut still = Vec::with_capacity(live.len());
            for &p in &live {
                let Some(&v) = self.seq.get(p) else { continue };
                match next {
                    None => next = Some(v),
                    Some(n) if n != v => return (ids, true, agreed),
                    Some(_) => {}
                }
                still.push(p + 1);
            }
            let Some(next) = next else { break };
            ids.push(next);
            agreed = still.len();
            live = still;
            if delimiters.contains(&next) {
                break;
            }
        }
        (ids, false, agreed)
    }
}

/// FNV-1a over the ids.
fn hash(ids: &[u32]) -> u64 {
    ids.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &id| (h ^ u64::from(id)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Proposals from the index.
pub struct EchoSource {
    pub index: EchoIndex,
    k: usize,
    max_span: usize,
    candidates: usize,
    delimiters: HashSet<u32>,
}

impl EchoSource {
    pub fn new(k: usize, max_span: usize, candidates: usize, index_max: usize, delimiters: HashSet<u32>, prompt: &[u32]) -> Self {
        let mut index = EchoIndex::new(k, index_max);
        index.append(prompt);
        EchoSource { index, k, max_span, candidates, delimiters }
    }

    pub fn window(&self) -> usize {
        self.k
    }

    pub fn observe(&mut self, ids: &[u32]) {
        self.index.append(ids);
    }

    /// What followed `tail`'s last k tokens before. Asserted only when it is corroborated
    /// (several occurrences agree), nothing forked, and it ends at a delimiter: a single
    /// occurrence is a copy, and a copy would replay whatever followed it, another speaker's
    /// turn included. Everything else is verified: a wrong guess costs a rewound forward, never
    /// a wrong token.
    pub fn propose(&self, tail: &[u32]) -> Option<Proposal> {
        let gram = tail.get(tail.len().checked_sub(self.k)?..)?;
        let anchors = self.index.candidates(gram, self.candidates);
        if anchors.is_empty() {
            return None;
        }
        let (ids, branch_stop, agreed) = self.index.extend(&anchors, self.max_span, &self.delimiters);
        if ids.len() < 2 {
            return None;
        }
        let at_delimiter = ids.last().is_some_and(|l| self.delimiters.contains(l));
        let policy = if !branch_stop && at_delimiter && agreed >= 2 { Policy::Assert } else { Policy::Verify };
        Some(Proposal { ids, policy, origin: Origin::Echo, branch_stop })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_follows_the_nearest_occurrences_and_stops_at_a_fork() {
        let mut index = EchoIndex::new(2, 1 << 20);
        // "1 2 3 4 5" twice, then "1 2 3 9": after "1 2" the histories agree on 3, then fork.
        index.append(&[1, 2, 3, 4, 5, 0, 1, 2, 3, 9, 0, 1, 2]);
        let anchors = index.candidates(&[1, 2], 24);
        assert_eq!(anchors, vec![6, 0], "nearest first; the last occurrence has no continuation");
        assert_eq!(index.extend(&anchors, 32, &HashSet::new()), (vec![3], true, 2));
        // The nearest occurrence alone runs on until the history ends.
        assert_eq!(index.extend(&anchors[..1], 32, &HashSet::new()), (vec![3, 9, 0, 1, 2], false, 1));
        assert_eq!(index.candidates(&[1, 2], 1), vec![6]);
        assert!(index.candidates(&[2, 1], 24).is_empty());
    }

    #[test]
    fn spans_end_at_a_delimiter_and_the_index_stops_growing_at_its_limit() {
        let mut index = EchoIndex::new(2, 8);
        index.append(&[7, 8, 1, 2, 3, 7, 8, 1, 2, 3, 4]);
        assert_eq!(index.seq.len(), 8);
        let delimiters = HashSet::from([2]);
        assert_eq!(index.extend(&index.candidates(&[7, 8], 24), 32, &delimiters), (vec![1, 2], false, 1));
        assert_eq!(index.extend(&index.candidates(&[7, 8], 24), 1, &HashSet::new()), (vec![1], false, 2));
    }

    #[test]
    fn the_policy_is_assert_only_for_a_corroborated_span_that_ends_at_a_delimiter() {
        let delim = HashSet::from([50]);
        // Two earlier occurrences of [1, 2] both continue "3 4 50".
        let prompt = [1, 2, 3, 4, 50, 9, 1, 2, 3, 4, 50, 8, 1, 2];
        let p = EchoSource::new(2, 32, 24, 1 << 20, delim.clone(), &prompt).propose(&prompt).expect("a span");
        assert_eq!((p.ids.as_slice(), p.policy, p.branch_stop), (&[3, 4, 50][..], Policy::Assert, false));
        // One occurrence: a copy, verified.
        let prompt = [1, 2, 3, 4, 50, 9, 1, 2];
        let p = EchoSource::new(2, 32, 24, 1 << 20, delim.clone(), &prompt).propose(&prompt).expect("a span");
        assert_eq!(p.policy, Policy::Verify);
        // Stopped at a fork, not at a delimiter: verified.
        let prompt = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5, 8, 1, 2];
        let p = EchoSource::new(2, 32, 24, 1 << 20, delim.clone(), &prompt).propose(&prompt).expect("a span");
        assert_eq!((p.ids.as_slice(), p.policy, p.branch_stop), (&[3, 4, 5][..], Policy::Verify, true));
        // A fork after one token leaves a span too short to propose.
        let prompt = [1, 2, 3, 4, 9, 1, 2, 3, 5, 1, 2];
        assert!(EchoSource::new(2, 32, 24, 1 << 20, delim, &prompt).propose(&prompt).is_none());
    }
}
