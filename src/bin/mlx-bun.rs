use mlx_bun::engine::{Engine, Event};
use mlx_bun::model::open_source;
use mlx_bun::sample::GenerateOptions;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (w, c) = open_source(std::path::Path::new(&args[1])).unwrap();
    let e = Engine::get();
    let id = e.load(w, c).blocking_recv().unwrap().unwrap();
    let prompt: Vec<u32> = args[2].split(',').map(|s| s.parse().unwrap()).collect();
    let mut opts = GenerateOptions::default();
    opts.max_tokens = args[3].parse().unwrap();
    let t = std::time::Instant::now();
    let mut h = e.generate(id, prompt, opts);
    while let Some(ev) = h.events.blocking_recv() {
        match ev {
            Event::Token { id, .. } => print!("{id},"),
            Event::Done { reason, stats } => { println!("\n{reason:?} {stats:?}"); break; }
            Event::Failed(err) => { println!("ERR {err}"); break; }
        }
    }
    eprintln!("{:?}", t.elapsed());
}
