//! Raw bindings to mlx-c, generated at build time (see build.rs).
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
include!(concat!(env!("OUT_DIR"), "/compat.rs"));
