"""HBM bytes and kernel counts of the memory-bound ops that eager PyTorch, torchao's FP8
prototype or a framework's own code runs around a layer, beyond what the extracted graph records
(each constant counted from the code that runs it; :mod:`autopar.cost.compute` prices them).
"""

#: Bytes an FP8 cast-transpose moves per element of a BF16 tensor: read 2, write the FP8 copy
#: and its FP8 transpose, 1 each (Transformer Engine's fused ``fp8_cast_transpose``, which the
#: FP8 recipe runs on a Linear's input and weight in forward and its output gradient in backward;
#: the amax reduction rides in the same pass).
FP8_CAST_BYTES_PER_ELEMENT = 4
#: HBM bytes per element of each FP8 cast around one Linear when torchao's float8nocompile
#: prototype runs it (``eager_parts`` "fp8_amax_casts"; torchao prototype/float8nocompile,
#: float8nocompile_linear.py ``matmul_with_args_in_hp`` and kernels/fp8_dynamic_tensorwise.py):
#: every cast first reads the bf16 tensor for its tensorwise amax (``_amax_atomic``: 2), then
#: converts it (read 2, write 1 per fp8 layout). Forward: the input to row- and column-major
#: fp8 (2 + 2 + 2 = 6 per element of the M x K input) and the weight to transposed fp8 (5 per
#: element of K x N); backward: the output gradient twice, row-major and transposed (2 x 5 per
#: element of M x N), and the weight again, column-major (5 per K x N). As (input, weight,
#: output gradient, weight in backward); the fused cast-transpose above is (4, 4, 4, 0).
FP8_AMAX_CAST_BYTES = (6, 5, 10, 5)
FP8_FUSED_CAST_BYTES = (FP8_CAST_BYTES_PER_ELEMENT, FP8_CAST_BYTES_PER_ELEMENT,
                        FP8_CAST_BYTES_PER_ELEMENT, 0)

#: HBM bytes per element an RMSNorm moves when eager PyTorch runs it as the model writes it, over
#: the 4 (read 2, write 2) of a fused kernel. Counted from the composite of Hugging Face's
#: LlamaRMSNorm.forward (and torch's composite rms_norm, the same ops): cast to fp32 (read 2,
#: write 4), pow (4, 4), mean (4, ~0), multiply by rsqrt (4 + ~0, 4), cast to bf16 (4, 2),
#: multiply by the weight (2, 2): 20 read + 16 written = 36 bytes. A LayerNorm module is one
#: fused kernel in eager PyTorch (aten native_layer_norm) and keeps its 4 bytes.
EAGER_RMSNORM_BYTES_PER_ELEMENT = 36
FUSED_NORM_BYTES_PER_ELEMENT = 4
#: HBM bytes per element of that eager RMSNorm's backward, as autograd runs the composite's
#: derivatives (torch/csrc/autograd/FunctionsManual.cpp and derivatives.yaml; counted with a
#: TorchDispatchMode census of aten calls, forward and backward, on CPU): weight multiply (grad x
#: weight: read 2, write 2; weight gradient: grad x h read 4 write 2, sum read 2), cast back to
#: fp32 (2, 4), the rsqrt multiply (grad x rsqrt: 4, 4; rsqrt gradient: grad x xf 8, 4, sum 4),
#: mean's backward (expand / n: 4, 4), pow's backward (pow 4, 4; x 2: 4, 4; x grad: 8, 4), the two
#: paths into xf added (8, 4), and the cast to the input dtype (4, 2): 96 bytes, over the 2 x 36
#: of an element-wise op's rule.
EAGER_RMSNORM_BWD_BYTES_PER_ELEMENT = 96
#: Kernels of that eager RMSNorm (cast, pow, mean, add eps, rsqrt, multiply, cast, weight
#: multiply), each paying the launch floor.
EAGER_RMSNORM_KERNELS = 8
#: Activations the graph folds into a fused gated linear unit act(a) * b
#: (:class:`autopar.graph.kernels.FusedGLUMeta`, recorded as a view at the activation). Eager
#: PyTorch runs ``F.silu(a) * b`` as written: an ``aten::silu`` kernel that reads ``a`` and
#: writes act(a) (same size and dtype), then ``aten::mul`` reading act(a) and ``b``; the
#: product's bytes equal the fused kernel's, so eager adds the activation's read + write,
#: :data:`EAGER_GLU_ACT_PASSES` times the bytes of ``a``, and one kernel launch. The activations
#: are :data:`autopar.cost.memory.GLU_ACTIVATIONS` (defined there: memory counts what eager
#: PyTorch saves of them, and this module imports memory).
EAGER_GLU_ACT_PASSES = 2
#: Its backward: autograd's ``silu_backward`` / ``gelu_backward`` (derivatives.yaml) is one
#: kernel reading the gradient of act(a) and ``a`` and writing the gradient of ``a``: 3 x the
#: bytes of ``a`` (the multiply's backward is the graph's ``mul``).
EAGER_GLU_ACT_BWD_PASSES = 3
#: HBM bytes per element of a fused norm whose input the framework first casts to fp32
#: (``eager_parts`` "norm_input_cast"; InternEvo c18bec9 internlm/model/modeling_internlm.py
#: ``self.norm1(_residual.float())`` before apex ``MixedFusedRMSNorm``): forward, the cast (read 2,
#: write 4) and the norm reading fp32 and writing bf16 (4 + 2) = 12, over the fused norm's 4;
#: backward, the norm's reading the output gradient (2) and the fp32 input (4) and writing the
#: fp32 input gradient (4), and the cast's backward turning it into bf16 (4 + 2) = 16. InternEvo
#: checkpoints the cast and norm (``dropout_selective_checkpoint``, on whenever ``checkpoint`` is
#: off), so a block's backward repeats their forward (12) unless the whole block is recomputed.
NORM_INPUT_CAST_FWD_BYTES = 12
NORM_INPUT_CAST_BWD_BYTES = 16


#: HBM bytes per logit element of torch's eager ``F.cross_entropy(logits.float(), labels)``
#: beyond the bytes of the logits as they come in (the graph's loss op reads them, bf16: 2, and
#: records the fp32 copy it writes), forward: the cast writes 4; ``log_softmax`` over a row longer
#: than a block's shared memory (128k fp32 = 513 KB) runs ATen's ``cunn_SoftMaxForward``
#: (aten/src/ATen/native/cuda/SoftMax.cu), which reads the row three times (max, sum of
#: exponentials, write pass) and writes it once: 16; ``nll_loss`` gathers one element per row
#: (nil): 20.
EAGER_CE_FWD_BYTES_PER_LOGIT = 20
#: Its backward (torch tools/autograd/derivatives.yaml): ``nll_loss_backward`` zero-fills a dense
#: fp32 [N, V] gradient (write 4) and scatters one element per row; ``_log_softmax_backward_data``
#: (``cunn_SoftMaxBackward``) reads the gradient for its row sum, then the gradient and the saved
#: output and writes the input gradient (4 + 4 + 4 + 4 = 16); the cast's backward reads the fp32
#: gradient (4) and writes it in the logits' dtype (counted with the logits): 24. Against one
#: H200 (``benchmarks/data/gpu/h200_sweep.json`` ``memory_bound`` rows "cross_entropy fwd+bwd
#: (fp32 upcast)"): 13.6 ms measured at 8192 x 128256 and 6.56 ms at 16384 x 32000; these
#: counts give 12.8 and 6.4 ms at the cost model's HBM rate, the graph's own bytes (6 forward,
#: twice that backward) 4.8 and 2.4 ms (``tests/test_issue25_eager_loss.py``).
EAGER_CE_BWD_BYTES_PER_LOGIT = 24
#: Kernels of that loss's forward: the cast, log_softmax, nll_loss.
EAGER_CE_KERNELS = 3
