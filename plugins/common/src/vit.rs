//! Vision-tower blocks shared by the family plugins' encoder graphs: a tower's weights by name,
//! its biased linears and layer norms, and the pre-norm ViT encoder layer of SigLIP and CLIP
//! (`layer_norm1`, self-attention with separate `q_proj`/`k_proj`/`v_proj`/`out_proj`, residual,
//! `layer_norm2`, `mlp.fc1`, activation, `mlp.fc2`, residual), with its parameter list in the
//! order the graph declares it.

use std::collections::HashMap;

use mlxcel_emit::{Func, Global, NumericContract, Value};

/// A tower's declared parameters and the prefix of its own logical names (`vision_tower/`).
#[derive(Debug)]
pub struct Tower<'a> {
    pub c: NumericContract,
    pub globals: &'a HashMap<String, Global>,
    pub prefix: &'a str,
    /// Every layer norm's epsilon.
    pub eps: f64,
}

impl Tower<'_> {
    /// The parameter `key` (a whole logical name).
    pub fn w(&self, f: &mut Func, key: &str) -> Value {
        let g = self.globals.get(key).expect("invariant: every parameter is declared");
        f.load(g)
    }

    /// The tower's parameter `name` (below its prefix).
    pub fn t(&self, f: &mut Func, name: &str) -> Value {
        self.w(f, &format!("{}{name}", self.prefix))
    }

    /// `x W^T + b` with the tower's `name.weight` and `name.bias`.
    pub fn linear(&self, f: &mut Func, x: &Value, name: &str) -> Value {
        let w = self.t(f, &format!("{name}.weight"));
        let b = self.t(f, &format!("{name}.bias"));
        self.c.linear(f, x, &w, Some(&b))
    }

    /// LayerNorm with the tower's `name.weight` and `name.bias`.
    pub fn layer_norm(&self, f: &mut Func, x: &Value, name: &str) -> Value {
        let w = self.t(f, &format!("{name}.weight"));
        let b = self.t(f, &format!("{name}.bias"));
        self.c.layer_norm(f, x, &w, &b, self.eps)
    }

    /// Full self-attention over the rows of `x [n, hidden]` with `heads` heads, the projections
    /// under `attn` (`encoder.layers.3.self_attn`); scores scaled after the product, as the
    /// references do.
    pub fn attention(&self, f: &mut Func, x: &Value, attn: &str, heads: usize) -> Value {
        let (n, e) = (x.shape()[0], x.shape()[1]);
        let d = e / heads;
        let project = |f: &mut Func, proj: &str| {
            let y = self.linear(f, x, &format!("{attn}.{proj}"));
            f.reshape(&y, &[n, heads, d])
        };
        let q = project(f, "q_proj");
        let k = project(f, "k_proj");
        let val = project(f, "v_proj");
        // scores [heads, n, n] = q k^T, then scaled (torch: matmul(q, k^T) * scaling).
        let scores = self.c.matmul(f, &q, &k, (&[1], &[1]), (&[2], &[2]));
        let scale = f.splat(scores.ty(), (d as f64).powf(-0.5));
        let scores = f.mul(&scores, &scale);
        let probs = self.c.softmax(f, &scores);
        // [heads, n, d] -> [n, heads * d]
        let out = self.c.matmul(f, &probs, &val, (&[0], &[1]), (&[2], &[0]));
        let out = f.transpose(&out, &[1, 0, 2]);
        let out = f.reshape(&out, &[n, e]);
        self.linear(f, &out, &format!("{attn}.out_proj"))
    }

    /// The pre-norm encoder layer under `layer` (`encoder.layers.3`), `act` the MLP's activation.
    pub fn pre_norm_layer(
        &self,
        f: &mut Func,
        x: &Value,
        layer: &str,
        heads: usize,
        act: impl Fn(&mut Func, &Value) -> Value,
    ) -> Value {
        let h = self.layer_norm(f, x, &format!("{layer}.layer_norm1"));
        let h = self.attention(f, &h, &format!("{layer}.self_attn"), heads);
        let x = self.c.residual(f, x, &h);
        let h = self.layer_norm(f, &x, &format!("{layer}.layer_norm2"));
        let h = self.linear(f, &h, &format!("{layer}.mlp.fc1"));
        let h = act(f, &h);
        let h = self.linear(f, &h, &format!("{layer}.mlp.fc2"));
        self.c.residual(f, &x, &h)
    }
}

/// The parameters of [`Tower::pre_norm_layer`] for the layer whose whole logical prefix is
/// `layer` (`vision_tower/encoder.layers.3`), in declaration order.
pub fn pre_norm_layer_parameters(layer: &str, hidden: usize, intermediate: usize) -> Vec<(String, Vec<usize>)> {
    let n = |s: &str| format!("{layer}.{s}");
    let (e, mlp) = (hidden, intermediate);
    vec![
        (n("layer_norm1.weight"), vec![e]),
        (n("layer_norm1.bias"), vec![e]),
        (n("self_attn.q_proj.weight"), vec![e, e]),
        (n("self_attn.q_proj.bias"), vec![e]),
        (n("self_attn.k_proj.weight"), vec![e, e]),
        (n("self_attn.k_proj.bias"), vec![e]),
        (n("self_attn.v_proj.weight"), vec![e, e]),
        (n("self_attn.v_proj.bias"), vec![e]),
        (n("self_attn.out_proj.weight"), vec![e, e]),
        (n("self_attn.out_proj.bias"), vec![e]),
        (n("layer_norm2.weight"), vec![e]),
        (n("layer_norm2.bias"), vec![e]),
        (n("mlp.fc1.weight"), vec![mlp, e]),
        (n("mlp.fc1.bias"), vec![mlp]),
        (n("mlp.fc2.weight"), vec![e, mlp]),
        (n("mlp.fc2.bias"), vec![e]),
    ]
}
