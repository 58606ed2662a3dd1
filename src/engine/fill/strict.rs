//! Strict rows: spans a chat template and a request's tools determine (the tool-call scaffold
//! once the model opened a call, the rest of a tool's name once its first tokens identify it,
//! the close of a call). Each row fires when the sequence ends with its trigger and appends its
//! span as an assertion: the span was cut from a rendering of the template itself, so the model
//! has no choice there.
use std::collections::HashMap;

use super::{Origin, Policy, Proposal};

/// Which part of a tool call a row covers (its origin: the template or the request's schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillKind {
    Scaffold,
    Name,
    Key,
    Close,
    TurnEnd,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FillRow {
    /// Tokens the sequence must end with for the row to fire.
    pub trigger: Vec<u32>,
    /// Tokens appended after the trigger.
    pub emit: Vec<u32>,
    pub kind: FillKind,
}

/// Rows indexed by the last token of their trigger, longest trigger first (the most specific
/// row wins; the plan's order breaks ties).
pub struct StrictRows {
    by_last: HashMap<u32, Vec<FillRow>>,
    longest: usize,
}

impl StrictRows {
    pub fn new(rows: Vec<FillRow>) -> Self {
        let mut by_last: HashMap<u32, Vec<FillRow>> = HashMap::new();
        let mut longest = 1;
        for row in rows {
            let Some(&last) = row.trigger.last() else { continue };
            if row.emit.is_empty() {
                continue;
            }
            longest = longest.max(row.trigger.len());
            by_last.entry(last).or_default().push(row);
        }
        for bucket in by_last.values_mut() {
            bucket.sort_by_key(|r| std::cmp::Reverse(r.trigger.len()));
        }
        StrictRows { by_last, longest }
    }

    pub fn window(&self) -> usize {
        self.longest
    }

    pub fn propose(&self, tail: &[u32]) -> Option<Proposal> {
        let bucket = self.by_last.get(tail.last()?)?;
        let row = bucket.iter().find(|r| tail.ends_with(&r.trigger))?;
        let origin = match row.kind {
            FillKind::Name | FillKind::Key => Origin::Schema,
            FillKind::Scaffold | FillKind::Close | FillKind::TurnEnd => Origin::Template,
        };
        Some(Proposal { ids: row.emit.clone(), policy: Policy::Assert, origin, branch_stop: false })
    }
}
