//! The prefix cache: layer caches of finished generations, kept by the tokens they hold, so that
//! a later prompt starting with the same tokens (the next turn of a chat, another request with
//! the same system prompt) prefills only what is new. A byte-capped LRU, as mlx-bun's
//! `PromptCache` and mlx-lm's `LRUPromptCache`:
//! - `take` prefers the entry of the caller's session (its continuation), then the longest
//!   common prefix; a hit leaves at least the prompt's last token to forward (the first decode
//!   step needs its logits), and it is removed from the cache and trimmed to the shared tokens.
//!   An entry that would need trimming but cannot be trimmed (a rotating cache that has wrapped,
//!   a linear-attention layer's recurrent state) is skipped; such an entry, which serves only
//!   prompts that extend all of it, stays in the cache when it is taken (the taker gets a
//!   snapshot: MLX copies a buffer two arrays share before writing to it), so every branch of a
//!   conversation can start from it.
//! - `put` takes ownership; an entry larger than the whole cap is dropped; least recently used
//!   entries go while the cache holds more than the cap.
//! - Entries live in namespaces: a prompt only ever meets entries of its own namespace.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::LayerCache;

/// Counters the JS thread reads (`engine.stats.prefixCache`) while the engine thread updates them.
#[derive(Debug, Default)]
pub struct PrefixStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Prompt tokens the hits saved from prefilling.
    pub hit_tokens: AtomicU64,
    pub evictions: AtomicU64,
    /// Rows that started from a snapshot of another row preparing with them, and the prompt
    /// tokens they so did not prefill.
    pub shared_prefills: AtomicU64,
    pub shared_tokens: AtomicU64,
    pub bytes: AtomicU64,
    pub entries: AtomicU64,
}

struct Entry {
    namespace: String,
    session: Option<String>,
    tokens: Vec<u32>,
    caches: Vec<LayerCache>,
    bytes: usize,
}

/// A taken entry: the caches hold the prompt's first `tokens` tokens.
pub struct PrefixHit {
    pub tokens: usize,
    pub caches: Vec<LayerCache>,
}

/// The default is a cache that keeps nothing.
#[derive(Default)]
pub struct PrefixCache {
    max_bytes: usize,
    /// Least recently used first.
    entries: Vec<Entry>,
    bytes: usize,
    stats: Arc<PrefixStats>,
}

impl PrefixCache {
    pub fn new(max_bytes: usize, stats: Arc<PrefixStats>) -> Self {
        PrefixCache { max_bytes, entries: Vec::new(), bytes: 0, stats }
    }

    pub fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// The best entry for `prompt` in `namespace`, taken out of the cache and trimmed to the
    /// tokens it shares with the prompt; `None` when no entry shares a usable prefix.
    pub fn take(&mut self, prompt: &[u32], namespace: &str, session: Option<&str>) -> Option<PrefixHit> {
        let usable: Vec<(usize, usize)> = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.namespace == namespace)
            .filter_map(|(i, e)| usable_prefix(e, prompt).map(|n| (i, n)))
            .collect();
        let own = session.and_then(|s| usable.iter().rev().find(|(i, _)| self.entries[*i].session.as_deref() == Some(s)));
        // The longest; among equals the most recently used (`max_by_key` returns the last).
        let best = own.or_else(|| usable.iter().max_by_key(|(_, n)| *n)).copied();
        let Some((i, n)) = best else {
            self.stats.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let caches = if self.entries[i].caches.iter().all(LayerCache::is_trimmable) {
            let mut e = self.entries.remove(i);
            self.bytes -= e.bytes;
            let extra = e.tokens.len() - n;
            for c in &mut e.caches {
                c.trim(extra);
            }
            e.caches
        } else {
            // Untrimmable, so used whole (`usable_prefix`): kept, now the most recently used.
            let e = self.entries.remove(i);
            let caches = e.caches.clone();
            self.entries.push(e);
            caches
        };
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        self.stats.hit_tokens.fetch_add(n as u64, Ordering::Relaxed);
        self.publish();
        Some(PrefixHit { tokens: n, caches })
    }

    /// Keeps `caches`, which hold exactly `tokens`. Returns whether it was kept: not when it is
    /// larger than the whole cap, or its layers disagree on how many positions they hold (a
    /// step that stopped between layers).
    pub fn put(&mut self, tokens: Vec<u32>, caches: Vec<LayerCache>, namespace: &str, session: Option<&str>) -> bool {
        let bytes: usize = caches.iter().map(LayerCache::nbytes).sum();
        if !self.enabled() || tokens.is_empty() || bytes > self.max_bytes || caches.iter().any(|c| c.offset() != tokens.len()) {
            return false;
        }
        // A session's continuation is its latest entry; an identical entry is replaced.
        self.entries.retain_mut(|e| {
            if e.namespace != namespace {
                return true;
            }
            if session.is_some() && e.session.as_deref() == session {
                e.session = None;
            }
            if e.tokens == tokens {
                self.bytes -= e.bytes;
                return false;
            }
            true
        });
        self.entries.push(Entry { namespace: namespace.to_owned(), session: session.map(str::to_owned), tokens, caches, bytes });
        self.bytes += bytes;
        while self.bytes > self.max_bytes {
            let e = self.entries.remove(0);
            self.bytes -= e.bytes;
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
        self.publish();
        true
    }

    /// A row took `tokens` prompt tokens from another row preparing with it.
    pub fn record_shared(&self, tokens: usize) {
        self.stats.shared_prefills.fetch_add(1, Ordering::Relaxed);
        self.stats.shared_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    /// Bytes of the entries held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Drops the least recently used entry; says whether there was one.
    pub fn reclaim_oldest(&mut self) -> bool {
        if self.entries.is_empty() {
            return false;
        }
        let e = self.entries.remove(0);
        self.bytes -= e.bytes;
        self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        self.publish();
        true
    }

    fn publish(&self) {
        self.stats.bytes.store(self.bytes as u64, Ordering::Relaxed);
        self.stats.entries.store(self.entries.len() as u64, Ordering::Relaxed);
    }
}

/// How many of `prompt`'s tokens entry `e` can provide: the common prefix, leaving the last
/// prompt token to forward; `None` if that is nothing or needs a trim the caches cannot take.
fn usable_prefix(e: &Entry, prompt: &[u32]) -> Option<usize> {
    let common = e.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    let n = common.min(prompt.len().saturating_sub(1));
    let trims = n < e.tokens.len();
    (n > 0 && (!trims || e.caches.iter().all(LayerCache::is_trimmable))).then_some(n)
}

#[cfg(test)]
mod tests {
    use mlx_rs::ops;

    use super::*;
    use crate::cache::{KvCache, RotatingKvCache};

    fn plain(len: usize) -> Vec<LayerCache> {
        let mut c = KvCache::default();
        if len > 0 {
            let kv = || ops::zeros::<f32>(&[1, 1, len as i32, 2]).unwrap();
            c.update_and_fetch(kv(), kv()).unwrap();
        }
        vec![LayerCache::Plain(c)]
    }

    fn cache(max_bytes: usize) -> PrefixCache {
        PrefixCache::new(max_bytes, Arc::default())
    }

    fn seq(r: std::ops::Range<u32>) -> Vec<u32> {
        r.collect()
    }

    #[test]
    fn the_longest_prefix_is_taken_out_and_trimmed() {
        let mut p = cache(1 << 30);
        assert!(p.put(seq(0..10), plain(10), "", None));
        assert!(p.put(seq(0..4), plain(4), "", None));
        let prompt: Vec<u32> = seq(0..8).into_iter().chain([99, 98]).collect();
        let hit = p.take(&prompt, "", None).unwrap();
        assert_eq!((hit.tokens, hit.caches[0].offset()), (8, 8));
        assert_eq!(p.entries.len(), 1, "the hit left the cache");
        // Capped at len - 1: the last prompt token is always forwarded.
        let hit = p.take(&seq(0..4), "", None).unwrap();
        assert_eq!((hit.tokens, hit.caches[0].offset()), (3, 3));
        assert!(p.take(&seq(0..4), "", None).is_none());
        assert!(p.take(&[5, 6], "", None).is_none());
        assert_eq!(p.stats.hits.load(Ordering::Relaxed), 2);
        assert_eq!(p.stats.misses.load(Ordering::Relaxed), 2);
        assert_eq!((p.bytes, p.stats.entries.load(Ordering::Relaxed)), (0, 0));
    }

    #[test]
    fn namespaces_isolate_and_a_session_continuation_beats_a_longer_prefix() {
        let mut p = cache(1 << 30);
        p.put(seq(0..20), plain(20), "a", None);
        assert!(p.take(&seq(0..30), "b", None).is_none());
        p.put(seq(0..12), plain(12), "a", Some("chat-1"));
        let hit = p.take(&seq(0..30), "a", Some("chat-1")).unwrap();
        assert_eq!(hit.tokens, 12);
        let hit = p.take(&seq(0..30), "a", Some("chat-2")).unwrap();
        assert_eq!(hit.tokens, 20);
    }

    #[test]
    fn a_wrapped_rotating_cache_is_never_trimmed() {
        let mut r = RotatingKvCache::new(4, 0);
        let kv = |n: i32| ops::zeros::<f32>(&[1, 1, n, 2]).unwrap();
        r.update_and_fetch(kv(6), kv(6)).unwrap();
        assert!(!r.is_trimmable());
        let mut p = cache(1 << 30);
        p.put(seq(0..6), vec![LayerCache::Rotating(r.clone())], "", None);
        // It would need one position trimmed (the prompt diverges at 5): skipped.
        assert!(p.take(&[0, 1, 2, 3, 4, 77, 78], "", None).is_none());
        // A continuation of all six tokens needs no trim.
        let hit = p.take(&seq(0..9), "", None).unwrap();
        assert_eq!((hit.tokens, hit.caches[0].offset()), (6, 6));
        // It stays for the next prompt that extends it (another branch of the conversation).
        assert_eq!(p.stats.entries.load(Ordering::Relaxed), 1);
        let again = p.take(&[0, 1, 2, 3, 4, 5, 42], "", None).unwrap();
        assert_eq!((again.tokens, again.caches[0].offset()), (6, 6));
        // Before wrapping it trims like a plain cache.
        let mut short = RotatingKvCache::new(8, 0);
        short.update_and_fetch(kv(6), kv(6)).unwrap();
        p.put(seq(0..6), vec![LayerCache::Rotating(short)], "", None);
        let hit = p.take(&[0, 1, 2, 9, 9], "", None).unwrap();
        assert_eq!((hit.tokens, hit.caches[0].offset()), (3, 3));
    }

    #[test]
    fn the_byte_cap_holds_in_lru_order_under_random_puts() {
        let entry_bytes = |len: usize| plain(len)[0].nbytes();
        let cap = 5 * entry_bytes(1);
        let mut p = cache(cap);
        // An entry over the whole cap is dropped at once.
        assert!(!p.put(seq(0..3000), plain(3000), "", None));
        let mut state = 0x2545_f491_u64;
        let mut next = |m: u64| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % m
        };
        // The expected order, least recently used first.
        let mut model: Vec<(String, Vec<u32>, usize)> = Vec::new();
        for _ in 0..1000 {
            let ns = format!("n{}", next(3));
            let tokens: Vec<u32> = (0..1 + next(4) as u32).map(|t| t + 10 * next(8) as u32).collect();
            if next(4) == 0 {
                let prompt = [tokens.clone(), vec![999]].concat();
                let hit = p.take(&prompt, &ns, None);
                let shared = |t: &[u32]| t.iter().zip(&prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
                let expect = (0..model.len()).filter(|&i| model[i].0 == ns && shared(&model[i].1) > 0).max_by_key(|&i| shared(&model[i].1));
                match (hit, expect) {
                    (Some(h), Some(i)) => {
                        assert_eq!(h.tokens, shared(&model[i].1));
                        model.remove(i);
                    }
                    (None, None) => {}
                    (h, e) => panic!("hit {:?}, expected entry {e:?}", h.map(|h| h.tokens)),
                }
                continue;
            }
            let bytes = entry_bytes(tokens.len());
            assert!(p.put(tokens.clone(), plain(tokens.len()), &ns, None));
            model.retain(|(n, t, _)| !(*n == ns && *t == tokens));
            model.push((ns, tokens, bytes));
            while model.iter().map(|m| m.2).sum::<usize>() > cap {
                model.remove(0);
            }
            assert!(p.bytes <= cap);
            let order: Vec<(&str, &[u32])> = p.entries.iter().map(|e| (e.namespace.as_str(), e.tokens.as_slice())).collect();
            let want: Vec<(&str, &[u32])> = model.iter().map(|(n, t, _)| (n.as_str(), t.as_slice())).collect();
            assert_eq!(order, want);
        }
        assert!(p.stats.evictions.load(Ordering::Relaxed) > 0);
        assert_eq!(p.stats.bytes.load(Ordering::Relaxed) as usize, p.bytes);
    }
}
