//! Token sampling: greedy, temperature, top-k, top-p and min-p over one row
//! of logits, with a per-request seeded RNG. Pure functions over a logits
//! slice and an RNG, so the batch engine can sample each slot's row with that
//! request's own `Sampler`.

use rand_chacha::{
    ChaCha8Rng,
    rand_core::{RngCore, SeedableRng},
};

/// How one request picks its next token. The filters apply in the order
/// transformers applies them: temperature, top-k, top-p, then min-p.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 picks the most likely token (greedy); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams::GREEDY
    }
}

/// Why a token could not be sampled.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("min_p must be in [0, 1], got {0}")]
    MinP(f32),
    #[error("the logits are empty")]
    EmptyLogits,
    #[error("logit {index} is NaN")]
    NanLogit { index: usize },
    #[error("every logit is -inf: no token can be sampled")]
    NoCandidate,
}

impl SamplingParams {
    pub const GREEDY: SamplingParams = SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0 };

    /// Checks every parameter is in range.
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplingError::Temperature(self.temperature));
        }
        // Written so that NaN fails too.
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return Err(SamplingError::MinP(self.min_p));
        }
        Ok(())
    }

    /// Whether the choice is deterministic argmax (temperature 0 or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

/// One request's sampler: its parameters and its own RNG stream, so the same
/// seed gives the same tokens whatever else runs in the batch.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler seeded with `seed`, or with a fresh seed from the OS when
    /// `None` (read it back with [`Sampler::seed`] to reproduce the run).
    pub fn new(params: SamplingParams, seed: Option<u64>) -> Result<Self, SamplingError> {
        params.validate()?;
        let seed = seed.unwrap_or_else(fresh_seed);
        Ok(Sampler { params, seed, rng: ChaCha8Rng::seed_from_u64(seed) })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Picks the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        sample(logits, &self.params, &mut self.rng)
    }
}

fn fresh_seed() -> u64 {
    match ChaCha8Rng::try_from_os_rng() {
        Ok(mut rng) => rng.next_u64(),
        // No OS entropy: the clock still gives distinct runs.
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15),
    }
}

/// The most likely token; the lowest id wins a tie (as `torch.argmax`).
pub fn greedy(logits: &[f32]) -> Result<u32, SamplingError> {
    check_logits(logits)?;
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    if logits[best] == f32::NEG_INFINITY {
        return Err(SamplingError::NoCandidate);
    }
    Ok(best as u32)
}

/// Picks a token from `logits` under `params`, drawing from `rng` only when
/// the choice is random.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut impl RngCore) -> Result<u32, SamplingError> {
    params.validate()?;
    if params.is_greedy() {
        return greedy(logits);
    }
    check_logits(logits)?;
    let t = f64::from(params.temperature);
    // -inf (masked) never qualifies.
    let mut ids: Vec<u32> = (0..logits.len() as u32).filter(|&i| logits[i as usize] > f32::NEG_INFINITY).collect();
    // Descending logit, ties by ascending id.
    let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    if params.top_k > 0 && params.top_k < ids.len() {
        ids.select_nth_unstable_by(params.top_k - 1, by_logit);
        ids.truncate(params.top_k);
    }
    // Only top-p needs the candidates in order; without it they stay in id
    // order (after top-k, in selection order), which spares sorting the
    // whole vocabulary on every step.
    if params.top_p < 1.0 {
        ids.sort_unstable_by(by_logit);
    }
    let Some(max) = ids.iter().map(|&i| logits[i as usize]).reduce(f32::max) else {
        return Err(SamplingError::NoCandidate);
    };

    // Softmax numerators of logits / temperature; the most likely is exactly 1.
    let max = f64::from(max) / t;
    let mut weights: Vec<f64> = ids.iter().map(|&i| (f64::from(logits[i as usize]) / t - max).exp()).collect();
    if params.top_p < 1.0 {
        // The smallest prefix whose mass reaches top_p (at least one token).
        let target = f64::from(params.top_p) * weights.iter().sum::<f64>();
        let mut mass = 0.0;
        let keep = weights.iter().position(|w| {
            mass += w;
            mass >= target
        });
        let keep = keep.map_or(weights.len(), |i| i + 1);
        ids.truncate(keep);
        weights.truncate(keep);
    }
    if params.min_p > 0.0 {
        // Relative to the most likely survivor, whose weight is 1 (transformers
        // compares renormalised probabilities: the same ratio).
        let floor = f64::from(params.min_p);
        let mut kept = weights.iter().map(|&w| w >= floor);
        ids.retain(|_| kept.next().unwrap_or(false));
        weights.retain(|&w| w >= floor);
    }

    let total: f64 = weights.iter().sum();
    let mut u = unit_f64(rng) * total;
    for (id, w) in ids.iter().zip(&weights) {
        if u < *w {
            return Ok(*id);
        }
        u -= w;
    }
    // Rounding left `u` a hair above the last bucket.
    ids.last().copied().ok_or(SamplingError::NoCandidate)
}

fn check_logits(logits: &[f32]) -> Result<(), SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    match logits.iter().position(|l| l.is_nan()) {
        Some(index) => Err(SamplingError::NanLogit { index }),
        None => Ok(()),
    }
}

/// A uniform draw in [0, 1) from the top 53 bits.
fn unit_f64(rng: &mut impl RngCore) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOGITS: [f32; 6] = [1.0, 3.0, 2.5, -1.0, 3.0, 0.0];

    fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams { temperature, top_k, top_p, min_p }
    }

    /// Draws `n` tokens with one seeded sampler.
    fn draws(p: SamplingParams, seed: u64, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(p, Some(seed)).expect("valid");
        (0..n).map(|_| s.sample(logits).expect("samples")).collect()
    }

    fn support(p: SamplingParams, logits: &[f32]) -> Vec<u32> {
        let mut seen = draws(p, 7, logits, 2000);
        seen.sort_unstable();
        seen.dedup();
        seen
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(greedy(&LOGITS), Ok(1));
        assert_eq!(greedy(&[f32::NEG_INFINITY, -5.0]), Ok(1));
        assert_eq!(draws(SamplingParams::GREEDY, 1, &LOGITS, 3), vec![1, 1, 1]);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        for seed in 0..20 {
            assert_eq!(draws(params(5.0, 1, 1.0, 0.0), seed, &LOGITS, 5), vec![1; 5]);
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_tokens() {
        let p = params(1.0, 0, 1.0, 0.0);
        let a = draws(p, 42, &LOGITS, 64);
        assert_eq!(a, draws(p, 42, &LOGITS, 64));
        assert_ne!(a, draws(p, 43, &LOGITS, 64), "another seed gives another stream");
        // A random seed is reported and replays the run.
        let mut s = Sampler::new(p, None).expect("valid");
        let first: Vec<u32> = (0..64).map(|_| s.sample(&LOGITS).expect("samples")).collect();
        assert_eq!(first, draws(p, s.seed(), &LOGITS, 64));
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        // Token 1 and 4 tie at the top; 2 is close; the rest are far below.
        let count =
            |t: f32, tok: u32| draws(params(t, 0, 1.0, 0.0), 3, &LOGITS, 4000).iter().filter(|&&x| x == tok).count();
        assert!(count(0.05, 3) == 0 && count(0.05, 0) == 0, "cold: only the top tokens");
        assert!(count(100.0, 3) > 400, "hot: nearly uniform, so token 3 appears about 1/6 of the time");
        assert_eq!(support(params(1.0, 0, 1.0, 0.0), &LOGITS), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn top_k_keeps_the_k_most_likely() {
        assert_eq!(support(params(1.0, 2, 1.0, 0.0), &LOGITS), vec![1, 4]);
        assert_eq!(support(params(1.0, 3, 1.0, 0.0), &LOGITS), vec![1, 2, 4]);
        assert_eq!(support(params(1.0, 100, 1.0, 0.0), &LOGITS).len(), 6, "k above the vocabulary keeps all");
    }

    #[test]
    fn top_p_keeps_the_smallest_covering_prefix() {
        // Probabilities 0.7, 0.2, 0.1 (logits are their logs).
        let l = [0.1f32.ln(), 0.7f32.ln(), 0.2f32.ln()];
        assert_eq!(support(params(1.0, 0, 0.5, 0.0), &l), vec![1]);
        assert_eq!(support(params(1.0, 0, 0.85, 0.0), &l), vec![1, 2]);
        assert_eq!(support(params(1.0, 0, 1.0, 0.0), &l), vec![0, 1, 2]);
    }

    #[test]
    fn min_p_drops_tokens_far_below_the_best() {
        let l = [0.1f32.ln(), 0.7f32.ln(), 0.2f32.ln()];
        // 0.2 >= 0.25 * 0.7 survives, 0.1 does not.
        assert_eq!(support(params(1.0, 0, 1.0, 0.25), &l), vec![1, 2]);
        assert_eq!(support(params(1.0, 0, 1.0, 0.1), &l), vec![0, 1, 2]);
        assert_eq!(support(params(1.0, 0, 1.0, 1.0), &l), vec![1]);
    }

    #[test]
    fn frequencies_follow_the_filtered_distribution() {
        let l = [0.2f32.ln(), 0.5f32.ln(), 0.3f32.ln()];
        let n = 40_000;
        let roots = [0.2f64.sqrt(), 0.5f64.sqrt(), 0.3f64.sqrt()];
        let root_sum: f64 = roots.iter().sum();
        for (p, want) in [
            (params(1.0, 0, 1.0, 0.0), [0.2, 0.5, 0.3]),
            // Temperature 2 takes square roots before renormalising.
            (params(2.0, 0, 1.0, 0.0), roots.map(|x| x / root_sum)),
            (params(1.0, 2, 1.0, 0.0), [0.0, 0.625, 0.375]),
            (params(1.0, 0, 0.7, 0.0), [0.0, 0.625, 0.375]),
            (params(1.0, 0, 1.0, 0.5), [0.0, 0.625, 0.375]),
        ] {
            let mut counts = [0usize; 3];
            for t in draws(p, 11, &l, n) {
                counts[t as usize] += 1;
            }
            for (c, w) in counts.iter().zip(want) {
                assert!((*c as f64 / n as f64 - w).abs() < 0.015, "{p:?}: counts {counts:?}, want {want:?}");
            }
        }
    }

    #[test]
    fn masked_tokens_are_never_sampled() {
        let l = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0];
        assert_eq!(support(params(2.0, 0, 1.0, 0.0), &l), vec![1, 3]);
    }

    #[test]
    fn invalid_parameters_and_logits_are_errors() {
        for (p, want) in [
            (params(-0.5, 0, 1.0, 0.0), SamplingError::Temperature(-0.5)),
            (params(f32::INFINITY, 0, 1.0, 0.0), SamplingError::Temperature(f32::INFINITY)),
            (params(1.0, 0, 0.0, 0.0), SamplingError::TopP(0.0)),
            (params(1.0, 0, 1.5, 0.0), SamplingError::TopP(1.5)),
            (params(1.0, 0, 1.0, -0.1), SamplingError::MinP(-0.1)),
            (params(1.0, 0, 1.0, 2.0), SamplingError::MinP(2.0)),
        ] {
            assert_eq!(Sampler::new(p, Some(0)).err(), Some(want.clone()), "{p:?}");
            assert_eq!(sample(&LOGITS, &p, &mut ChaCha8Rng::seed_from_u64(0)), Err(want));
        }
        assert!(matches!(params(1.0, 0, f32::NAN, 0.0).validate(), Err(SamplingError::TopP(_))));
        let mut s = Sampler::new(params(1.0, 0, 1.0, 0.0), Some(0)).expect("valid");
        assert_eq!(s.sample(&[]), Err(SamplingError::EmptyLogits));
        assert_eq!(s.sample(&[0.0, f32::NAN]), Err(SamplingError::NanLogit { index: 1 }));
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 3]), Err(SamplingError::NoCandidate));
        assert_eq!(greedy(&[f32::NEG_INFINITY; 3]), Err(SamplingError::NoCandidate));
    }
}
