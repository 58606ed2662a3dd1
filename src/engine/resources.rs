//! Releasing several resources as one step (mlx-bun's `disposeResources`): every release runs
//! exactly once, in order, even after earlier ones fail. Ownership itself is Rust's: a resource
//! is released when its owner drops it or hands it to one of these releases, and moving it
//! elsewhere is mlx-bun's `transfer`.
use crate::error::{catch_panic, Error, Result};

pub type Release<'a> = Box<dyn FnOnce() -> Result<()> + 'a>;

/// Runs every release; one failure is returned as is, several as `Error::Aggregate`. A release
/// that panics fails as `INTERNAL_ERROR` and the others still run.
pub fn dispose_all(releases: Vec<Release<'_>>) -> Result<()> {
    let mut errors: Vec<Error> = releases.into_iter().filter_map(|r| catch_panic(r).err()).collect();
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(Error::Aggregate(errors)),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn every_release_runs_once_and_errors_aggregate() {
        let ran = Cell::new(0);
        let ran = &ran;
        let ok = || -> Release<'_> {
            Box::new(move || {
                ran.set(ran.get() + 1);
                Ok(())
            })
        };
        let fail = |m: &'static str| -> Release<'_> {
            Box::new(move || {
                ran.set(ran.get() + 1);
                Err(Error::Protocol(m.into()))
            })
        };
        assert!(dispose_all(vec![ok(), ok()]).is_ok());
        assert_eq!(ran.get(), 2);
        assert_eq!(dispose_all(vec![fail("a"), ok()]).unwrap_err().to_string(), "a");
        assert_eq!(ran.get(), 4);
        match dispose_all(vec![fail("a"), ok(), fail("b")]) {
            Err(Error::Aggregate(v)) => assert_eq!(v.len(), 2),
            other => panic!("expected an aggregate, got {other:?}"),
        }
        assert_eq!(ran.get(), 7);
    }
}
