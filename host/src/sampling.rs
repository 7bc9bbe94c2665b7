//! Token sampling: repetition, frequency and presence penalties, then greedy,
//! temperature, top-k, top-p and min-p over one row of logits, with a
//! per-request seeded RNG, and optionally the log-probabilities of the chosen
//! token and of the most likely ones. Pure functions over a logits slice, the
//! request's token history and an RNG, so the batch engine can sample each
//! slot's row with that request's own `Sampler`.

use crate::grammar::Constraint;
use rand_chacha::{
    ChaCha8Rng,
    rand_core::{RngCore, SeedableRng},
};

/// The most top log-probabilities a request may ask for (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How one request picks its next token. The penalties apply first, as vLLM
/// applies them (repetition, then frequency, then presence); then the
/// filters, in the order transformers applies them: temperature, top-k,
/// top-p, then min-p.
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
    /// Penalises every distinct token of the prompt and of the generated
    /// tokens, as transformers' `RepetitionPenaltyLogitsProcessor` (and
    /// vLLM): a positive logit is divided by it, any other multiplied by it.
    /// 1 is off; above 1 discourages repeats, below 1 encourages them.
    pub repetition_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (the
    /// prompt does not count), as OpenAI and vLLM; in [-2, 2], 0 is off.
    pub frequency_penalty: f32,
    /// Subtracted once from the logit of every token generated at least once
    /// (the prompt does not count), as OpenAI and vLLM; in [-2, 2], 0 is off.
    pub presence_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams::GREEDY
    }
}

/// Why a token could not be sampled, or a sampler not built.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("min_p must be in [0, 1], got {0}")]
    MinP(f32),
    #[error("repetition_penalty must be a finite number > 0, got {0}")]
    RepetitionPenalty(f32),
    #[error("frequency_penalty must be in [-2, 2], got {0}")]
    FrequencyPenalty(f32),
    #[error("presence_penalty must be in [-2, 2], got {0}")]
    PresencePenalty(f32),
    #[error("top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {0}")]
    TopLogprobs(usize),
    #[error("logit_bias for token {token} must be in [-100, 100], got {bias}")]
    LogitBias { token: u32, bias: f32 },
    #[error("logit_bias names token {token}, outside the model's {vocab} logits")]
    LogitBiasToken { token: u32, vocab: usize },
    #[error("the logits are empty")]
    EmptyLogits,
    #[error("logit {index} is NaN")]
    NanLogit { index: usize },
    #[error("every logit is -inf: no token can be sampled")]
    NoCandidate,
    /// The request's grammar (structured output) failed; the message says how.
    #[error("{0}")]
    Grammar(String),
}

impl SamplingParams {
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
    };

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
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(SamplingError::RepetitionPenalty(self.repetition_penalty));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(SamplingError::FrequencyPenalty(self.frequency_penalty));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(SamplingError::PresencePenalty(self.presence_penalty));
        }
        Ok(())
    }

    /// Whether the choice is deterministic argmax (temperature 0 or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Whether any penalty is on (otherwise the history is not looked at).
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }
}

/// A request's logical tokens so far, which the penalties look at: the
/// prompt's, then the generated ones (the token being sampled not included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct History<'a> {
    pub prompt: &'a [u32],
    pub generated: &'a [u32],
}

/// Log-probabilities of one sampled position: the log-softmax of the raw
/// model logits (before penalties and temperature, as vLLM reports them by
/// default), computed in f64 and reported as f32.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token's.
    pub logprob: f32,
    /// The most likely tokens with theirs, as many as asked for (fewer when
    /// fewer tokens have a finite logit: masked tokens are never listed), by
    /// log-probability descending, ties by lower token id. It may or may not
    /// include the chosen token.
    pub top: Vec<(u32, f32)>,
}

/// One sampled token, with its log-probabilities when the sampler was asked
/// for them.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprobs: Option<TokenLogprobs>,
}

/// One request's sampler: its parameters, its own RNG stream (so the same
/// seed gives the same tokens whatever else runs in the batch), whether it
/// reports log-probabilities, and the grammar its tokens must follow, if any.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: ChaCha8Rng,
    top_logprobs: Option<usize>,
    /// OpenAI's `logit_bias`: added to these tokens' logits before anything else.
    logit_bias: Vec<(u32, f32)>,
    /// Structured output: only tokens this grammar allows next may be sampled.
    constraint: Option<Box<Constraint>>,
}

impl Sampler {
    /// A sampler seeded with `seed`, or with a fresh seed from the OS when
    /// `None` (read it back with [`Sampler::seed`] to reproduce the run). It
    /// reports no log-probabilities (see [`Sampler::with_logprobs`]).
    pub fn new(params: SamplingParams, seed: Option<u64>) -> Result<Self, SamplingError> {
        params.validate()?;
        let seed = seed.unwrap_or_else(fresh_seed);
        Ok(Sampler {
            params,
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            top_logprobs: None,
            logit_bias: Vec::new(),
            constraint: None,
        })
    }

    /// The same sampler reporting log-probabilities: `None` none, `Some(n)`
    /// the chosen token's and the `n` most likely tokens' (see
    /// [`TokenLogprobs`]). More than [`MAX_TOP_LOGPROBS`] is refused.
    pub fn with_logprobs(self, top: Option<usize>) -> Result<Self, SamplingError> {
        if let Some(n) = top
            && n > MAX_TOP_LOGPROBS
        {
            return Err(SamplingError::TopLogprobs(n));
        }
        Ok(Sampler { top_logprobs: top, ..self })
    }

    /// The same sampler adding `bias[token]` to the token's logit before the penalties and the
    /// filters, as OpenAI's `logit_bias` ("added to the logits generated by the model prior to
    /// sampling"): -100 in effect bans a token, 100 in effect forces it. Each bias must be in
    /// [-100, 100]; the log-probabilities stay the model's.
    pub fn with_logit_bias(self, bias: Vec<(u32, f32)>) -> Result<Self, SamplingError> {
        if let Some(&(token, bias)) = bias.iter().find(|(_, b)| !(-100.0..=100.0).contains(b)) {
            return Err(SamplingError::LogitBias { token, bias });
        }
        Ok(Sampler { logit_bias: bias, ..self })
    }

    /// The same sampler choosing only among the tokens `constraint` allows next (after the
    /// bias and the penalties, so a filter never brings back a token the grammar excludes),
    /// and moving it past each token chosen.
    pub fn with_constraint(self, constraint: Constraint) -> Self {
        Sampler { constraint: Some(Box::new(constraint)), ..self }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// How many top log-probabilities each token reports, if any are.
    pub fn top_logprobs(&self) -> Option<usize> {
        self.top_logprobs
    }

    /// Picks the next token from one row of logits: the logit bias, then the
    /// penalties from `history` (on a copy of the row; with neither the row is
    /// sampled as is), then [`sample`]; log-probabilities come from the raw row.
    pub fn sample(&mut self, logits: &[f32], history: History<'_>) -> Result<Sampled, SamplingError> {
        let adjust = self.params.has_penalties() || !self.logit_bias.is_empty() || self.constraint.is_some();
        let token = if adjust {
            check_logits(logits)?;
            let mut adjusted = logits.to_vec();
            for &(token, bias) in &self.logit_bias {
                let vocab = adjusted.len();
                let logit = adjusted.get_mut(token as usize).ok_or(SamplingError::LogitBiasToken { token, vocab })?;
                *logit += bias;
            }
            apply_penalties(&mut adjusted, &self.params, history);
            if let Some(constraint) = &mut self.constraint {
                constraint.restrict(&mut adjusted).map_err(|e| SamplingError::Grammar(e.to_string()))?;
            }
            sample(&adjusted, &self.params, &mut self.rng)?
        } else {
            sample(logits, &self.params, &mut self.rng)?
        };
        if let Some(constraint) = &mut self.constraint {
            constraint.accept(token).map_err(|e| SamplingError::Grammar(e.to_string()))?;
        }
        let logprobs = self.top_logprobs.map(|top| token_logprobs(logits, token, top));
        Ok(Sampled { token, logprobs })
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

/// Applies `params`' penalties to `logits` in place, as vLLM does, in f32:
///
/// 1. repetition: each distinct token of the prompt and the generated tokens
///    (counted once however often it occurs), as transformers'
///    `RepetitionPenaltyLogitsProcessor`: a logit > 0 is divided by the
///    penalty, any other multiplied by it;
/// 2. frequency: `count * frequency_penalty` subtracted, `count` the token's
///    occurrences among the generated tokens;
/// 3. presence: `presence_penalty` subtracted once for each distinct
///    generated token.
///
/// Ids outside the row are ignored. A penalty that is off changes nothing.
pub fn apply_penalties(logits: &mut [f32], params: &SamplingParams, history: History<'_>) {
    let vocab = logits.len();
    let rep = params.repetition_penalty;
    if rep != 1.0 {
        let mut seen: Vec<u32> = history.prompt.iter().chain(history.generated).copied().collect();
        seen.sort_unstable();
        seen.dedup();
        for id in seen.into_iter().map(|t| t as usize).filter(|&i| i < vocab) {
            let l = &mut logits[id];
            *l = if *l > 0.0 { *l / rep } else { *l * rep };
        }
    }
    let (freq, presence) = (params.frequency_penalty, params.presence_penalty);
    if freq != 0.0 || presence != 0.0 {
        let mut generated = history.generated.to_vec();
        generated.sort_unstable();
        for run in generated.chunk_by(|a, b| a == b) {
            let id = run[0] as usize;
            if id >= vocab {
                continue;
            }
            if freq != 0.0 {
                logits[id] -= run.len() as f32 * freq;
            }
            if presence != 0.0 {
                logits[id] -= presence;
            }
        }
    }
}

/// The log-probabilities of `token` and of the `top` most likely tokens
/// under `logits` (see [`TokenLogprobs`]): the log-softmax in f64, reported
/// as f32. Expects what a successful [`sample`] leaves: no NaN, a finite
/// most likely logit and `token` in range (an id out of range panics).
pub fn token_logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let max = f64::from(logits.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    let log_norm = max + sum.ln();
    let logprob_of = |l: f32| (f64::from(l) - log_norm) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        // Ids come in ascending order, so an equal log-probability never
        // displaces (or goes before) one already kept: ties keep the lower id.
        for (id, &l) in logits.iter().enumerate() {
            if l == f32::NEG_INFINITY {
                continue;
            }
            let lp = logprob_of(l);
            if best.len() == top && best.last().is_some_and(|&(_, worst)| lp <= worst) {
                continue;
            }
            let at = best.partition_point(|&(_, kept)| kept >= lp);
            best.insert(at, (id as u32, lp));
            best.truncate(top);
        }
    }
    TokenLogprobs { logprob: logprob_of(logits[token as usize]), top: best }
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
        SamplingParams { temperature, top_k, top_p, min_p, ..SamplingParams::GREEDY }
    }

    fn penalties(repetition_penalty: f32, frequency_penalty: f32, presence_penalty: f32) -> SamplingParams {
        SamplingParams { repetition_penalty, frequency_penalty, presence_penalty, ..SamplingParams::GREEDY }
    }

    fn history<'a>(prompt: &'a [u32], generated: &'a [u32]) -> History<'a> {
        History { prompt, generated }
    }

    /// Draws `n` tokens with one seeded sampler and no history.
    fn draws(p: SamplingParams, seed: u64, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(p, Some(seed)).expect("valid");
        (0..n).map(|_| s.sample(logits, History::default()).expect("samples").token).collect()
    }

    /// Draws `n` tokens with one seeded sampler, each fed back as generated.
    fn generate(s: &mut Sampler, logits: &[f32], prompt: &[u32], n: usize) -> Vec<u32> {
        let mut generated = Vec::new();
        for _ in 0..n {
            let token = s.sample(logits, history(prompt, &generated)).expect("samples").token;
            generated.push(token);
        }
        generated
    }

    /// The greedy choice under `p`'s penalties.
    fn pick(p: SamplingParams, logits: &[f32], h: History<'_>) -> u32 {
        Sampler::new(p, Some(0)).expect("valid").sample(logits, h).expect("samples").token
    }

    fn penalised(p: SamplingParams, logits: &[f32], h: History<'_>) -> Vec<f32> {
        let mut l = logits.to_vec();
        apply_penalties(&mut l, &p, h);
        l
    }

    fn support(p: SamplingParams, logits: &[f32]) -> Vec<u32> {
        let mut seen = draws(p, 7, logits, 2000);
        seen.sort_unstable();
        seen.dedup();
        seen
    }

    /// The bias is added before everything else: -100 bans the greedy pick, 100 forces a token
    /// under any sampling, out-of-range biases and ids are refused, and log-probabilities stay
    /// the model's.
    #[test]
    fn logit_bias_bans_and_forces_tokens() {
        let logits = random_row(3, 64);
        let best = greedy(&logits).expect("greedy");
        let biased = |bias: Vec<(u32, f32)>, params: SamplingParams, seed: u64| {
            Sampler::new(params, Some(seed))
                .and_then(|s| s.with_logprobs(Some(1)))
                .and_then(|s| s.with_logit_bias(bias))
        };
        let mut s = biased(vec![(best, -100.0)], SamplingParams::GREEDY, 0).expect("sampler");
        let got = s.sample(&logits, History::default()).expect("sample");
        assert_ne!(got.token, best);
        let weakest = (0..64u32)
            .filter(|&i| logits[i as usize].is_finite())
            .min_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]));
        let weakest = weakest.expect("a finite logit");
        let hot = params(1.5, 0, 0.95, 0.0);
        for seed in 0..20 {
            let mut s = biased(vec![(weakest, 100.0)], hot, seed).expect("sampler");
            let got = s.sample(&logits, History::default()).expect("sample");
            assert_eq!(got.token, weakest, "seed {seed}");
            let raw = token_logprobs(&logits, weakest, 1);
            assert_eq!(got.logprobs.expect("logprobs").logprob, raw.logprob, "the model's log-probability");
        }
        assert_eq!(
            biased(vec![(1, 100.5)], SamplingParams::GREEDY, 0).err(),
            Some(SamplingError::LogitBias { token: 1, bias: 100.5 })
        );
        assert!(biased(vec![(1, f32::NAN)], SamplingParams::GREEDY, 0).is_err());
        let mut s = biased(vec![(64, 1.0)], SamplingParams::GREEDY, 0).expect("sampler");
        assert_eq!(
            s.sample(&logits, History::default()).err(),
            Some(SamplingError::LogitBiasToken { token: 64, vocab: 64 })
        );
    }

    /// A row of `n` logits in [-10, 10), every 17th masked.
    fn random_row(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|i| if i % 17 == 5 { f32::NEG_INFINITY } else { (unit_f64(&mut rng) * 20.0 - 10.0) as f32 })
            .collect()
    }

    /// ln softmax(logits)[i], the textbook way in f64 (fine for small logits).
    fn naive_logprob(logits: &[f32], i: usize) -> f64 {
        let total: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        (f64::from(logits[i]).exp() / total).ln()
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
        let first: Vec<u32> = (0..64).map(|_| s.sample(&LOGITS, History::default()).expect("samples").token).collect();
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
    fn repetition_penalty_divides_positive_and_multiplies_other_logits() {
        let l = [2.0, 1.8, -0.5, -0.6];
        assert_eq!(pick(SamplingParams::GREEDY, &l, history(&[0], &[])), 0);
        // 2.0 / 1.5 = 1.33 falls below 1.8, whether token 0 was prompted or generated.
        assert_eq!(pick(penalties(1.5, 0.0, 0.0), &l, history(&[0], &[])), 1);
        assert_eq!(pick(penalties(1.5, 0.0, 0.0), &l, history(&[], &[0])), 1);
        assert_eq!(penalised(penalties(1.5, 0.0, 0.0), &l, history(&[0], &[2])), [2.0 / 1.5, 1.8, -0.5 * 1.5, -0.6]);
        // A negative logit is multiplied: -1.0 becomes -1.5, below -1.2 (dividing would keep token 0).
        assert_eq!(pick(penalties(1.5, 0.0, 0.0), &[-1.0, -1.2], history(&[0], &[])), 1);
        // Below 1 it encourages: 1.0 / 0.5 = 2.0 beats 1.2.
        assert_eq!(pick(penalties(0.5, 0.0, 0.0), &[1.0, 1.2], history(&[0], &[])), 0);
        // Once per distinct token: 3.0 / 1.5 = 2.0 still beats 1.5 (three times would give 0.89).
        assert_eq!(pick(penalties(1.5, 0.0, 0.0), &[3.0, 1.5], history(&[0, 0], &[0, 0, 0])), 0);
        // Ids outside the row are ignored.
        assert_eq!(penalised(penalties(1.5, 0.0, 0.0), &[3.0, 1.5], history(&[9], &[7])), [3.0, 1.5]);
    }

    #[test]
    fn frequency_penalty_subtracts_count_times_penalty_per_generated_token() {
        let l = [3.0, 2.5, 0.0];
        // Token 0 generated twice, 1 once: 3 - 2 * 0.3 = 2.4 still beats 2.5 - 0.3 = 2.2 ...
        assert_eq!(pick(penalties(1.0, 0.3, 0.0), &l, history(&[], &[0, 1, 0])), 0);
        // ... but 3 - 2 * 0.6 = 1.8 does not beat 2.5 - 0.6 = 1.9.
        assert_eq!(pick(penalties(1.0, 0.6, 0.0), &l, history(&[], &[0, 1, 0])), 1);
        assert_eq!(
            penalised(penalties(1.0, 0.6, 0.0), &l, history(&[], &[0, 1, 0])),
            [3.0 - 2.0 * 0.6, 2.5 - 0.6, 0.0]
        );
        // A negative penalty encourages: 2.5 + 2 * 0.3 = 3.1 beats 3.0, once only 2.8 does not.
        assert_eq!(pick(penalties(1.0, -0.3, 0.0), &l, history(&[], &[1, 1])), 1);
        assert_eq!(pick(penalties(1.0, -0.3, 0.0), &l, history(&[], &[1])), 0);
    }

    #[test]
    fn presence_penalty_subtracts_once_per_distinct_generated_token() {
        let l = [3.0, 2.5];
        // Once: 3 - 0.4 = 2.6 beats 2.5 (three times would give 1.8).
        assert_eq!(pick(penalties(1.0, 0.0, 0.4), &l, history(&[], &[0, 0, 0])), 0);
        assert_eq!(pick(penalties(1.0, 0.0, 0.6), &l, history(&[], &[0, 0, 0])), 1);
        assert_eq!(penalised(penalties(1.0, 0.0, 0.4), &l, history(&[], &[0, 0, 0])), [3.0 - 0.4, 2.5]);
    }

    #[test]
    fn only_repetition_penalty_counts_prompt_tokens() {
        let l = [3.0, 2.5, 1.0];
        let prompt = [0, 0, 0, 0, 2];
        assert_eq!(pick(penalties(1.0, 2.0, 2.0), &l, history(&prompt, &[])), 0);
        assert_eq!(penalised(penalties(1.0, 2.0, 2.0), &l, history(&prompt, &[])), l);
        assert_eq!(penalised(penalties(2.0, 2.0, 2.0), &l, history(&prompt, &[])), [1.5, 2.5, 0.5]);
        assert_eq!(pick(penalties(2.0, 0.0, 0.0), &l, history(&prompt, &[])), 1);
    }

    #[test]
    fn penalties_apply_repetition_then_frequency_then_presence() {
        let l = [4.0, 0.0, 1.0];
        let p = penalties(2.0, 0.5, 0.25);
        // (4 / 2 - 2 * 0.5) - 0.25 = 0.75; subtracting before dividing would give 1.375.
        assert_eq!(penalised(p, &l, history(&[2], &[0, 0])), [4.0 / 2.0 - 2.0 * 0.5 - 0.25, 0.0, 1.0 / 2.0]);
        assert_eq!(pick(p, &[4.0, 0.0, 0.6], history(&[], &[0, 0])), 0);
        assert_eq!(pick(p, &[4.0, 0.0, 0.8], history(&[], &[0, 0])), 2);
        // Masked tokens stay masked.
        let masked = penalised(penalties(0.5, -2.0, -2.0), &[f32::NEG_INFINITY, 1.0], history(&[0], &[0, 0]));
        assert_eq!(masked[0], f32::NEG_INFINITY);
    }

    #[test]
    fn all_penalties_off_is_bit_identical_to_the_plain_path() {
        let row = random_row(5, 1000);
        let prompt: Vec<u32> = (0..200).collect();
        for p in [
            SamplingParams::GREEDY,
            params(0.7, 0, 1.0, 0.0),
            params(1.3, 40, 1.0, 0.0),
            params(1.0, 0, 0.9, 0.0),
            params(1.0, 0, 1.0, 0.05),
            params(0.8, 50, 0.95, 0.02),
        ] {
            for seed in 0..8 {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let plain: Vec<u32> = (0..64).map(|_| sample(&row, &p, &mut rng).expect("samples")).collect();
                let mut s = Sampler::new(p, Some(seed)).expect("valid");
                assert_eq!(generate(&mut s, &row, &prompt, 64), plain, "{p:?}, seed {seed}");
                // The stream is left where the plain path left it.
                assert_eq!(s.rng.next_u64(), rng.next_u64(), "{p:?}, seed {seed}");
            }
        }
    }

    #[test]
    fn a_seeded_sampler_with_penalties_is_reproducible() {
        let row = random_row(9, 500);
        let prompt: Vec<u32> = (100..180).collect();
        let p = SamplingParams { temperature: 1.0, ..penalties(1.3, 0.4, 0.3) };
        let run = |seed| generate(&mut Sampler::new(p, Some(seed)).expect("valid"), &row, &prompt, 100);
        let a = run(3);
        assert_eq!(a, run(3));
        assert_ne!(a, run(4), "another seed gives another stream");
        // Greedy with a repetition penalty walks down the row without repeating itself.
        let mut s = Sampler::new(penalties(100.0, 0.0, 0.0), Some(0)).expect("valid");
        let tokens = generate(&mut s, &row, &prompt, 20);
        let mut distinct = tokens.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 20, "{tokens:?}");
        assert!(tokens.iter().all(|t| !prompt.contains(t)), "{tokens:?}");
    }

    #[test]
    fn logprobs_are_the_log_softmax_of_the_raw_logits() {
        let l = [0.5, -1.0, 2.0, 0.0, f32::NEG_INFINITY, 1.5];
        // Penalties and temperature change the choice, not the reported logprobs.
        let p = SamplingParams { temperature: 0.8, ..penalties(1.7, 0.5, 0.5) };
        let mut s = Sampler::new(p, Some(1)).expect("valid").with_logprobs(Some(3)).expect("at most 20");
        let mut generated = Vec::new();
        for _ in 0..200 {
            let Sampled { token, logprobs } = s.sample(&l, history(&[2], &generated)).expect("samples");
            let logprobs = logprobs.expect("asked for");
            let want = naive_logprob(&l, token as usize);
            assert!((f64::from(logprobs.logprob) - want).abs() < 1e-6, "token {token}: {logprobs:?}, want {want}");
            let ids: Vec<u32> = logprobs.top.iter().map(|&(id, _)| id).collect();
            assert_eq!(ids, [2, 5, 0]);
            for (id, lp) in logprobs.top {
                assert!((f64::from(lp) - naive_logprob(&l, id as usize)).abs() < 1e-6, "{id}: {lp}");
            }
            generated.push(token);
        }
        let mut seen = generated.clone();
        seen.sort_unstable();
        seen.dedup();
        assert!(seen.len() >= 4, "the draws reach beyond the top tokens: {seen:?}");
        // Large logits: the f64 log-sum-exp does not overflow.
        let big = token_logprobs(&[1000.0, 999.0, -1000.0], 1, 1);
        let want = -(1.0 + 1.0f64.exp()).ln();
        assert!((f64::from(big.logprob) - want).abs() < 1e-6, "{big:?}");
        assert_eq!(big.top, [(0, -(1.0 + (-1.0f64).exp()).ln() as f32)]);
    }

    #[test]
    fn top_logprobs_sort_descending_with_ties_by_lower_id() {
        let l = [1.0, 3.0, 2.0, 3.0, 2.0, f32::NEG_INFINITY];
        let top = |n| {
            let mut s =
                Sampler::new(SamplingParams::GREEDY, Some(0)).expect("valid").with_logprobs(Some(n)).expect("n");
            let sampled = s.sample(&l, History::default()).expect("samples");
            assert_eq!(sampled.token, 1);
            let logprobs = sampled.logprobs.expect("asked for");
            if let Some(first) = logprobs.top.first() {
                assert_eq!(*first, (1, logprobs.logprob), "the chosen token is the most likely");
            }
            logprobs.top
        };
        let ids = |n| top(n).iter().map(|&(id, _)| id).collect::<Vec<_>>();
        assert_eq!(ids(4), [1, 3, 2, 4]);
        assert_eq!(ids(3), [1, 3, 2]);
        // Masked tokens are not listed.
        assert_eq!(ids(20), [1, 3, 2, 4, 0]);
        assert_eq!(ids(0), Vec::<u32>::new());
        let t = top(5);
        assert!(t[0].1 == t[1].1 && t[2].1 == t[3].1 && t[1].1 > t[2].1 && t[3].1 > t[4].1, "{t:?}");
        // Ascending logits (every token displaces the last kept one).
        let rising: Vec<f32> = (0..50).map(|i| i as f32 / 10.0).collect();
        let got: Vec<u32> = token_logprobs(&rising, 0, 3).top.iter().map(|&(id, _)| id).collect();
        assert_eq!(got, [49, 48, 47]);
        let mut plain = Sampler::new(SamplingParams::GREEDY, Some(0)).expect("valid");
        assert_eq!(plain.sample(&l, History::default()), Ok(Sampled { token: 1, logprobs: None }));
    }

    #[test]
    fn more_than_20_top_logprobs_are_refused() {
        let s = || Sampler::new(SamplingParams::GREEDY, Some(0)).expect("valid");
        assert_eq!(s().with_logprobs(Some(21)).err(), Some(SamplingError::TopLogprobs(21)));
        assert_eq!(s().with_logprobs(Some(20)).map(|s| s.top_logprobs()), Ok(Some(20)));
        assert_eq!(s().with_logprobs(None).map(|s| s.top_logprobs()), Ok(None));
        assert_eq!(s().top_logprobs(), None);
    }

    #[test]
    fn invalid_parameters_and_logits_are_errors() {
        let rep = |r| SamplingParams { repetition_penalty: r, ..params(1.0, 0, 1.0, 0.0) };
        let freq = |f| SamplingParams { frequency_penalty: f, ..params(1.0, 0, 1.0, 0.0) };
        let pres = |p| SamplingParams { presence_penalty: p, ..params(1.0, 0, 1.0, 0.0) };
        for (p, want) in [
            (params(-0.5, 0, 1.0, 0.0), SamplingError::Temperature(-0.5)),
            (params(f32::INFINITY, 0, 1.0, 0.0), SamplingError::Temperature(f32::INFINITY)),
            (params(1.0, 0, 0.0, 0.0), SamplingError::TopP(0.0)),
            (params(1.0, 0, 1.5, 0.0), SamplingError::TopP(1.5)),
            (params(1.0, 0, 1.0, -0.1), SamplingError::MinP(-0.1)),
            (params(1.0, 0, 1.0, 2.0), SamplingError::MinP(2.0)),
            (rep(0.0), SamplingError::RepetitionPenalty(0.0)),
            (rep(-1.0), SamplingError::RepetitionPenalty(-1.0)),
            (rep(f32::INFINITY), SamplingError::RepetitionPenalty(f32::INFINITY)),
            (freq(2.5), SamplingError::FrequencyPenalty(2.5)),
            (freq(-2.01), SamplingError::FrequencyPenalty(-2.01)),
            (pres(3.0), SamplingError::PresencePenalty(3.0)),
            (pres(f32::NEG_INFINITY), SamplingError::PresencePenalty(f32::NEG_INFINITY)),
        ] {
            assert_eq!(Sampler::new(p, Some(0)).err(), Some(want.clone()), "{p:?}");
            assert_eq!(sample(&LOGITS, &p, &mut ChaCha8Rng::seed_from_u64(0)), Err(want));
        }
        for p in [params(1.0, 0, f32::NAN, 0.0), rep(f32::NAN), freq(f32::NAN), pres(f32::NAN)] {
            assert!(p.validate().is_err(), "{p:?}");
        }
        for p in [rep(0.01), freq(-2.0), freq(2.0), pres(-2.0), pres(2.0)] {
            assert_eq!(p.validate(), Ok(()), "{p:?}");
        }
        for p in [params(1.0, 0, 1.0, 0.0), penalties(1.2, 0.5, 0.5)] {
            let mut s = Sampler::new(p, Some(0)).expect("valid").with_logprobs(Some(2)).expect("n");
            let h = history(&[0], &[1]);
            assert_eq!(s.sample(&[], h), Err(SamplingError::EmptyLogits));
            assert_eq!(s.sample(&[0.0, f32::NAN], h), Err(SamplingError::NanLogit { index: 1 }));
            assert_eq!(s.sample(&[f32::NEG_INFINITY; 3], h), Err(SamplingError::NoCandidate));
        }
        assert_eq!(greedy(&[f32::NEG_INFINITY; 3]), Err(SamplingError::NoCandidate));
    }
}
