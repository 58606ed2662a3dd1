//! The numbers an evaluation reports, from per-position values on the host: perplexity as
//! mlx-lm's `eval_ppl` reports it, and KL against a saved teacher as mlx-bun's eval README
//! defines it (all in f32 per position; sums over positions in f64).
use serde::Serialize;

/// One position's KL(p ‖ q) over the reference's top-k and the mass of p those ids hold:
/// `KL = Σ_j p_j·(log p_j − log q_j)` with `log p_j = ref_j − ref_lse` and
/// `log q_j = cand_j − cand_lse`, where `cand` holds the candidate's logits of the same ids and
/// `cand_lse` its logsumexp over the full vocabulary.
pub fn position_kl(reference: &[f32], ref_lse: f32, cand: &[f32], cand_lse: f32) -> (f32, f32) {
    let (mut kl, mut mass) = (0f32, 0f32);
    for (&r, &c) in reference.iter().zip(cand) {
        let log_p = r - ref_lse;
        let p = log_p.exp();
        kl += p * (log_p - (c - cand_lse));
        mass += p;
    }
    (kl, mass)
}

/// Per-position KL results, summarized.
#[derive(Default)]
pub struct KlSummary {
    kls: Vec<f32>,
    mass: Vec<f32>,
    agree: usize,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub p95: f64,
    pub max: f64,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct Mass {
    pub mean: f64,
    pub min: f64,
}

#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KlReport {
    pub positions: usize,
    pub kl: Spread,
    /// How much of the reference's distribution the truncated sum covers: a KL over little mass
    /// is not comparable with one over nearly all of it.
    pub captured_mass: Mass,
    /// Positions where the candidate's argmax over the full vocabulary is the reference's top id.
    pub top1_agreement: f64,
}

impl KlSummary {
    pub fn push(&mut self, kl: f32, mass: f32, agrees: bool) {
        self.kls.push(kl);
        self.mass.push(mass);
        self.agree += usize::from(agrees);
    }

    pub fn report(mut self) -> KlReport {
        let n = self.kls.len();
        let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / v.len().max(1) as f64;
        let kl_mean = mean(&self.kls);
        let mass_mean = mean(&self.mass);
        self.kls.sort_by(f32::total_cmp);
        KlReport {
            positions: n,
            kl: Spread { mean: kl_mean, p95: nearest_rank(&self.kls, 0.95), max: self.kls.last().map_or(0.0, |&x| x as f64) },
            captured_mass: Mass { mean: mass_mean, min: self.mass.iter().copied().reduce(f32::min).unwrap_or(0.0) as f64 },
            top1_agreement: self.agree as f64 / n.max(1) as f64,
        }
    }
}

/// The `q` quantile of `sorted` by the nearest-rank rule: the smallest value with at least
/// q·n values at or below it (0 for no values).
fn nearest_rank(sorted: &[f32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Perplexity {
    /// Tokens scored: every window's tokens but its first.
    pub scored: usize,
    pub mean_nll: f64,
    pub perplexity: f64,
    /// mlx-lm's: perplexity × the losses' standard deviation (n − 1) / √n.
    pub standard_error: f64,
}

impl Perplexity {
    /// From each scored token's negative log-likelihood.
    pub fn from_losses(losses: &[f32]) -> Perplexity {
        let n = losses.len() as f64;
        let mean = losses.iter().map(|&l| l as f64).sum::<f64>() / n;
        // One loss has no sample variance (mlx-lm's would be NaN): its error is reported as 0.
        let var = if n > 1.0 { losses.iter().map(|&l| (l as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
        let perplexity = mean.exp();
        Perplexity { scored: losses.len(), mean_nll: mean, perplexity, standard_error: perplexity * var.sqrt() / n.sqrt() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_distributions_have_zero_kl_and_their_top_k_mass() {
        let logits = [3.0f32, 1.5, 0.25];
        let lse = 3.6;
        let (kl, mass) = position_kl(&logits, lse, &logits, lse);
        assert_eq!(kl, 0.0);
        let want: f32 = logits.iter().map(|l| (l - lse).exp()).sum();
        assert_eq!(mass, want);
    }

    #[test]
    fn kl_is_the_truncated_sum_of_the_definition() {
        // A two-token vocabulary, both ids listed: p = (0.75, 0.25), q = (0.5, 0.5).
        let (p, q) = ([0.75f32, 0.25], [0.5f32, 0.5]);
        let reference = [p[0].ln(), p[1].ln()];
        let cand = [q[0].ln() + 2.0, q[1].ln() + 2.0];
        let (kl, mass) = position_kl(&reference, 0.0, &cand, 2.0);
        let want = 0.75f32 * (0.75f32 / 0.5).ln() + 0.25 * (0.25f32 / 0.5).ln();
        assert!((kl - want).abs() < 1e-6, "{kl} vs {want}");
        assert!((mass - 1.0).abs() < 1e-6);
        // Only the first id listed: the sum and the mass cover p's 0.75.
        let (kl1, mass1) = position_kl(&reference[..1], 0.0, &cand[..1], 2.0);
        assert!((kl1 - 0.75 * (1.5f32).ln()).abs() < 1e-6);
        assert!((mass1 - 0.75).abs() < 1e-6);
    }

    #[test]
    fn report_has_mean_nearest_rank_p95_mass_and_agreement() {
        let mut s = KlSummary::default();
        for i in 0..20 {
            s.push(i as f32, 0.5 + i as f32 / 40.0, i % 4 != 0);
        }
        let r = s.report();
        assert_eq!(r.positions, 20);
        assert_eq!(r.kl, Spread { mean: 9.5, p95: 18.0, max: 19.0 });
        assert_eq!(r.captured_mass.min, 0.5);
        assert!((r.captured_mass.mean - (0.5 + 9.5 / 40.0)).abs() < 1e-7);
        assert_eq!(r.top1_agreement, 0.75);
        assert_eq!(nearest_rank(&[1.0], 0.95), 1.0);
        assert_eq!(nearest_rank(&[], 0.95), 0.0);
    }

    #[test]
    fn perplexity_is_exp_of_the_mean_loss_with_mlx_lms_standard_error() {
        let p = Perplexity::from_losses(&[1.0, 2.0, 3.0]);
        assert_eq!(p.scored, 3);
        assert_eq!(p.mean_nll, 2.0);
        assert!((p.perplexity - 2f64.exp()).abs() < 1e-12);
        // Sample standard deviation of 1, 2, 3 is 1.
        assert!((p.standard_error - 2f64.exp() / 3f64.sqrt()).abs() < 1e-12);
        assert_eq!(Perplexity::from_losses(&[0.5]).standard_error, 0.0);
    }
}
