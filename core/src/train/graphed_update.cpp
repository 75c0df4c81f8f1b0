#include "graphed_update.h"

#include <fmt/format.h>

#include "torch_api.h"
#ifdef NORMLAB_WITH_CUDA
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <limits>
#include <map>

#include "normlab/data/dataset.h"
#include "normlab/model/transformer_model.h"
#include "normlab/train/run_events.h"
#include "run/optimizer.h"
#include "speed_levers.h"
#include "torch_compat.h"

namespace normlab {
namespace {

// The shape of a graph's static input for a batch: translation batches grow to a bucket (lengths
// up to a multiple of 8, rows up to the most that max_tokens allows at those lengths), so that a
// few graphs serve an epoch of differently shaped batches. Language-model blocks keep their shape.
struct BucketShape {
  int64_t rows = 0, src_len = 0, tgt_len = 0;
  bool unpadded = false;  // the batch fills it and tgt_in holds no pad: causal attention alone

  static BucketShape of(const DeviceBatch& b, int64_t max_tokens, int64_t pad_id) {
    BucketShape s{b.tgt_in.size(0), b.src.defined() ? b.src.size(1) : 0, b.tgt_in.size(1),
                  b.unpadded};
    if (!b.src.defined() || max_tokens <= 0 || pad_id < 0) return s;
    auto up8 = [](int64_t n) { return (n + 7) / 8 * 8; };
    s.src_len = up8(s.src_len);
    s.tgt_len = up8(s.tgt_len);
    // BatchPlan keeps rows · max(src, tgt length) ≤ max_tokens (or one row over it), and both
    // lengths are within 7 of the bucket's.
    s.rows =
        std::max(s.rows, max_tokens / std::max<int64_t>(std::max(s.src_len, s.tgt_len) - 7, 1));
    s.unpadded = s.unpadded && s.rows == b.tgt_in.size(0) && s.tgt_len == b.tgt_in.size(1);
    return s;
  }
  std::string text() const {
    return (src_len ? fmt::format("{}x{}→", rows, src_len) : "") +
           fmt::format("{}x{}{}", rows, tgt_len, unpadded ? "" : " padded");
  }
};

std::string shape_key(const std::vector<BucketShape>& shapes) {
  std::string key;
  for (const BucketShape& s : shapes) key += (key.empty() ? "" : " + ") + s.text();
  return key;
}

// A static input of that shape, on the batch's device.
DeviceBatch static_input(const DeviceBatch& b, const BucketShape& s) {
  DeviceBatch in;
  const auto o = b.tgt_in.options();
  if (b.src.defined()) in.src = torch::empty({s.rows, s.src_len}, o);
  in.tgt_in = torch::empty({s.rows, s.tgt_len}, o);
  in.tgt_out = torch::empty({s.rows, s.tgt_len}, o);
  in.unpadded = s.unpadded;
  return in;
}

// b into a static input of its bucket: pad around it; each extra row one token (EOS as a source,
// BOS as the decoder's input) so that its attention has a key, and no target (no loss, no
// gradient).
void copy_into(torch::Tensor& to, const torch::Tensor& from, int64_t pad_id,
               int64_t extra_row_token) {
  if (to.sizes() == from.sizes()) {
    to.copy_(from, /*non_blocking=*/true);
    return;
  }
  to.fill_(pad_id);
  to.narrow(0, 0, from.size(0)).narrow(1, 0, from.size(1)).copy_(from, /*non_blocking=*/true);
  if (extra_row_token >= 0 && to.size(0) > from.size(0))
    to.narrow(0, from.size(0), to.size(0) - from.size(0)).select(1, 0).fill_(extra_row_token);
}

}  // namespace

struct GraphedUpdate::Impl {
  struct Shape {
    std::vector<DeviceBatch> inputs;  // the static inputs: each update's batches are copied in
    torch::Tensor out;                // the graph's [loss sum, nll sum, gradient norm, skipped]
    int64_t made = 0;                 // updates of this shape so far
#ifdef NORMLAB_WITH_CUDA
    std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
  };

  TransformerModelImpl& model;
  FlatAdamW& optimizer;
  bool capture;
  int64_t max_tokens, pad_id;  // translation batches' buckets (max_tokens 0: each batch's shape)
  torch::Tensor ntok;          // the update's target tokens (double), on the model's device
  torch::Tensor lr;            // the learning rate (float on CUDA: what at::_fused_adamw_ reads)
  std::map<std::string, Shape> shapes;
  Counts counts;
  std::vector<std::string> notes;
  bool said_full = false;
#ifdef NORMLAB_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> stream;  // warm-ups, captures and replays run on it
  at::cuda::CUDAEvent ready, done;  // the caller's work before, the graph stream's after
  c10::MempoolId_t pool{0, 0};      // the graphs share one memory pool
#endif

  Impl(TransformerModelImpl& m, FlatAdamW& o, bool c, int64_t max_tok, int64_t pad)
      : model(m), optimizer(o), capture(c), max_tokens(max_tok), pad_id(pad) {
    const auto device = model.output_weight().device();
    ntok = torch::ones({}, torch::TensorOptions(torch::kDouble).device(device));
    lr = torch::zeros(
        {}, torch::TensorOptions(device.is_cuda() ? torch::kFloat : torch::kDouble).device(device));
  }

  // run_update's update from gradients to step, in device operations only (nothing here may wait
  // for the device: it is what a graph records). Returns [loss sum, nll sum, norm, skipped].
  torch::Tensor body(const std::vector<DeviceBatch>& inputs, const StepSettings& st) {
    optimizer.zero_grad();
    const torch::Tensor n = ntok.to(torch::kFloat);
    // The loss over the update's tokens, rounded as run_update's division by a host number: on
    // CUDA that is a product with its float reciprocal, on the CPU a division.
    const bool cuda = n.is_cuda();
    const torch::Tensor inv = cuda ? n.reciprocal() : torch::Tensor();
    torch::Tensor loss_sum, nll_sum, z_sum;
    for (const DeviceBatch& b : inputs) {
      const LossSums s = batch_loss(model, b, st.forward);
      (cuda ? s.loss * inv : s.loss / n).backward();
      loss_sum = loss_sum.defined() ? loss_sum + s.loss.detach() : s.loss.detach();
      nll_sum = nll_sum.defined() ? nll_sum + s.nll.detach() : s.nll.detach();
      z_sum = z_sum.defined() ? z_sum + s.z.detach() : s.z.detach();
    }
    model.after_backward();
    torch::NoGradGuard no_grad;
    const double max_norm =
        st.clip_norm > 0 ? st.clip_norm : std::numeric_limits<double>::infinity();
    const torch::Tensor gnorm = optimizer.clip_grad_norm_on_device(max_norm);
    // run_update's divergence tests, whose step it does not make.
    const torch::Tensor skip =
        loss_sum.isfinite()
            .logical_and(gnorm.isfinite())
            .logical_and(nll_sum.to(torch::kDouble).div(ntok).le(st.divergence_nll))
            .logical_not()
            .to(torch::kFloat);
    optimizer.step_on_device(lr, skip);
    return torch::stack({loss_sum.to(torch::kFloat), nll_sum.to(torch::kFloat), gnorm, skip,
                         z_sum.to(torch::kFloat) * float(st.forward.z_loss)});
  }

  void set_inputs(Shape& s, const std::vector<DeviceBatch>& batches, const StepSettings& st,
                  int64_t tokens) {
    ntok.fill_(double(std::max<int64_t>(tokens, 1)));
    lr.fill_(st.lr);
    optimizer.prepare_device_step();
    for (size_t i = 0; i < batches.size(); ++i) {
      DeviceBatch& to = s.inputs[i];
      const DeviceBatch& from = batches[i];
      if (to.src.defined()) copy_into(to.src, from.src, pad_id, data::kEos);
      copy_into(to.tgt_in, from.tgt_in, pad_id, data::kBos);
      copy_into(to.tgt_out, from.tgt_out, pad_id, -1);
#ifdef NORMLAB_WITH_CUDA
      // The batches were made on the caller's stream and are read on this one: their memory
      // must not go back to the caller's stream before the copies are done.
      if (capture)
        for (const torch::Tensor& t : {from.src, from.tgt_in, from.tgt_out})
          if (t.defined()) t.record_stream(*stream);
#endif
    }
  }

#ifdef NORMLAB_WITH_CUDA
  void capture_graph(Shape& s, const StepSettings& st, const std::string& key) {
    s.graph = std::make_unique<at::cuda::CUDAGraph>();
    // Autocast's cache of cast weights would keep tensors of the graph's pool between updates
    // (PyTorch's make_graphed_callables requires it off).
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    try {
      s.graph->capture_begin(pool);
      try {
        s.out = body(s.inputs, st);
      } catch (...) {
        try {
          s.graph->capture_end();
        } catch (...) {
        }
        throw;
      }
      s.graph->capture_end();
    } catch (const std::exception& e) {
      at::autocast::set_autocast_cache_enabled(cache);
      s.graph.reset();
      const std::string what = e.what();
      throw std::runtime_error(fmt::format(
          "run.cuda_graph: the update of batch shape {} could not be recorded as a CUDA graph "
          "({}); train with run.cuda_graph = false",
          key, what.substr(0, what.find('\n'))));
    }
    at::autocast::set_autocast_cache_enabled(cache);
    if (pool == c10::MempoolId_t{0, 0}) pool = s.graph->pool();
    ++counts.graphs;
    notes.push_back(fmt::format("update recorded as a CUDA graph for batch shape {} ({} so far)",
                                key, counts.graphs));
  }

  // On the graph stream, ordered after the caller's work and before the caller's next.
  torch::Tensor on_graph_stream(Shape& s, const std::vector<DeviceBatch>& batches,
                                const StepSettings& st, int64_t tokens, const std::string& key) {
    const c10::DeviceIndex dev = ntok.device().index();
    if (!stream) stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, dev);
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(dev);
    ready.record(caller);
    ready.block(*stream);
    torch::Tensor out;
    {
      c10::cuda::CUDAStreamGuard guard(*stream);
      set_inputs(s, batches, st, tokens);
      if (s.made < kWarmups) {
        out = body(s.inputs, st);
      } else {
        if (!s.graph) capture_graph(s, st, key);
        s.graph->replay();
        out = s.out;
      }
      out = out.to(torch::kCPU, torch::kDouble);  // the update's one wait for the device
    }
    done.record(*stream);
    done.block(caller);
    return out;
  }
#endif
};

std::string GraphedUpdate::unavailable(const FlatAdamW& optimizer, const StepSettings& settings,
                                       const torch::Device& device, bool activation_checkpointing) {
  if (!device.is_cuda()) return "CUDA graphs are for a CUDA device (run.device)";
#if !NORMLAB_TORCH_2 || !defined(NORMLAB_WITH_CUDA)
  return "this normlab was built without LibTorch 2.x's CUDA";
#endif
  if (settings.forward.dtype == "fp16")
    return "fp16's dynamic loss scale is decided on the host each update (use bf16)";
  if (settings.group) return "a data-parallel job's all-reduce is not recorded";
  if (!optimizer.flat() || optimizer.sharded())
    return "AdamW's parameters are not one flat buffer, or are sharded";
  if (activation_checkpointing)
    return "activation checkpointing sets the generators' states when it recomputes a layer";
  if (!speed_levers().fused_loss || !speed_levers().fused_projection)
    return "the full logits' loss (the fused loss lever is off)";
  if (!speed_levers().cuda_fused || !speed_levers().cuda_adamw)
    return "the recorded update takes LibTorch's fused AdamW, which is off for this run";
  return "";
}

GraphedUpdate::GraphedUpdate(TransformerModelImpl& model, FlatAdamW& optimizer, bool capture,
                             int64_t max_tokens, int64_t pad_id)
    : impl_(std::make_unique<Impl>(model, optimizer, capture, max_tokens, pad_id)) {
  if (capture && !model.output_weight().is_cuda())
    throw std::invalid_argument("GraphedUpdate: CUDA graphs record a CUDA model's update");
}

GraphedUpdate::~GraphedUpdate() = default;

const GraphedUpdate::Counts& GraphedUpdate::counts() const { return impl_->counts; }

std::vector<std::string> GraphedUpdate::take_notes() {
  std::vector<std::string> out;
  out.swap(impl_->notes);
  return out;
}

std::optional<UpdateResult> GraphedUpdate::run(const std::vector<DeviceBatch>& batches,
                                               const StepSettings& settings, int64_t u,
                                               RunObserver& events) {
  Impl& m = *impl_;
  m.model.on_update(u - 1);
  if (batches.empty() || events.watches_update(u)) {
    ++m.counts.eager;
    return std::nullopt;
  }
  std::vector<BucketShape> buckets;
  for (const DeviceBatch& b : batches)
    buckets.push_back(BucketShape::of(b, m.max_tokens, m.pad_id));
  const std::string key = shape_key(buckets);
  auto it = m.shapes.find(key);
  if (it == m.shapes.end()) {
    if (m.shapes.size() >= kMaxGraphs) {
      if (!m.said_full)
        m.notes.push_back(fmt::format(
            "{} batch shapes have CUDA graphs, the most kept: updates of other shapes are eager",
            kMaxGraphs));
      m.said_full = true;
      ++m.counts.eager;
      return std::nullopt;
    }
    Impl::Shape s;
    for (size_t i = 0; i < batches.size(); ++i)
      s.inputs.push_back(static_input(batches[i], buckets[i]));
    it = m.shapes.emplace(key, std::move(s)).first;
    ++m.counts.shapes;
  }
  Impl::Shape& shape = it->second;
  int64_t tokens = 0;
  for (const DeviceBatch& b : batches) tokens += b.tokens;
  m.optimizer.set_lr(settings.lr);  // the host's copy (checkpoints)
  const torch::Device device = m.ntok.device();
  const torch::Tensor rng_before = compat::cpu_rng_state();
  const torch::Tensor cuda_rng_before = compat::cuda_rng_state(device);
  torch::Tensor out;
#ifdef NORMLAB_WITH_CUDA
  if (m.capture) out = m.on_graph_stream(shape, batches, settings, tokens, key);
#endif
  if (!m.capture) {
    m.set_inputs(shape, batches, settings, tokens);
    out = m.body(shape.inputs, settings).to(torch::kDouble);
  }
  ++shape.made;
  const double* v = out.data_ptr<double>();
  if (v[3] != 0) {
    // Nothing was stepped: run_update makes this update again, with the same dropout masks, and
    // reports what diverged (and where) as it does without graphs.
    compat::set_cpu_rng_state(rng_before);
    compat::set_cuda_rng_state(device, cuda_rng_before);
    ++m.counts.eager;
    return std::nullopt;
  }
  m.optimizer.count_step();
  m.model.after_step();
  ++m.counts.made;
  UpdateResult r;
  const double ntok = double(std::max<int64_t>(tokens, 1));
  r.tokens = tokens;
  r.loss = v[0] / ntok;
  r.nll = v[1] / ntok;
  r.z_loss = v[4] / ntok;
  r.gnorm = v[2];
  return r;
}

}  // namespace normlab
