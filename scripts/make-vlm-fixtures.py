#!/usr/bin/env python3
"""make-vlm-fixtures.py - tiny random vision-language models + transformers reference outputs.

Writes, for each family (gemma3, qwen2_5_vl, llava, smolvlm), into daemon/tests/fixtures/vlm/<family>/:
  config.json, generation_config.json, model.safetensors (float32), tokenizer.json, tokenizer_config.json,
  chat_template.jinja, preprocessor_config.json, processor_config.json, reference.json

The models are structurally faithful but tiny (vision hidden 32, text hidden 64, 2-4 layers) and randomly
initialised from fixed seeds; the processors are transformers' PIL-backend classes (`*ImageProcessorPil`)
built from explicit kwargs. Nothing is downloaded: the tokenizer is the locally trained byte-level BPE of
shared/fixtures/tiny-models (made by its make_fixtures.py) with each family's special tokens added.
reference.json records, for two test images (daemon/tests/fixtures/vision/images/grad_37x23.png and
noise_64x48.png, one prompt each, plus one prompt holding both): the rendered prompt, the expanded prompt
token ids, pixel_values (+ image_grid_thw / rows, cols), the image embeddings that replace the placeholders,
Qwen2.5-VL's M-RoPE position ids, the prompt logits and 8 greedy tokens. See daemon/tests/fixtures/vlm/README.md.

Usage:
  HF_HUB_OFFLINE=1 python scripts/make-vlm-fixtures.py [--out DIR] [--base-tokenizer PATH] [FAMILY ...]
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import hashlib
import json
import platform
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import PIL
import safetensors
import tokenizers
import torch
import transformers
from PIL import Image
from safetensors.torch import load_file
from tokenizers import AddedToken, Tokenizer, processors
from transformers import GenerationConfig, PreTrainedTokenizerFast
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)  # single-threaded CPU kernels: bit-reproducible reruns

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "daemon" / "tests" / "fixtures" / "vlm"
IMAGE_DIR = ROOT / "daemon" / "tests" / "fixtures" / "vision" / "images"
VISION_FIXTURES = ROOT / "daemon" / "tests" / "fixtures" / "vision"
DEFAULT_BASE_TOKENIZER = ROOT.parent / "shared" / "fixtures" / "tiny-models" / "llama" / "tokenizer.json"
BASE_TOKENIZER_SHA256 = "a0c73f2ae12db714987b93a14fb5fe76e7d99f83df341038f7dc534cfe737540"
IMAGES = ["grad_37x23.png", "noise_64x48.png"]
PROMPT_TEXT = "Describe this image."
PROMPT_TEXT_2 = "Compare the two images."
MAX_NEW_TOKENS = 8
ALL_LOGITS_CASES = ("grad",)  # cases whose logits are written for every prompt position ...
ALL_LOGITS_MAX_FLOATS = 70_000  # ... when seq_len * vocab is at most this, else for the last TAIL_POSITIONS
TAIL_POSITIONS = 24

INIT_STD = 0.2  # matrices, embeddings, conv kernels
NORM_STD = 0.2  # norm weights = base + NORM_STD * N(0, 1)
BIAS_STD = 0.1  # biases (and LayerNorm biases)
GEMMA_EMBED_STD = 0.05  # as in shared/fixtures/tiny-models (x sqrt(64) = 0.4 effective)

# --------------------------------------------------------------------------------------------------------------
# Chat templates (the families' real templates, as transcribed: see README "Chat templates")
# --------------------------------------------------------------------------------------------------------------

# google/gemma-3-*-it (tokenizer_config.json / chat_template.json)
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)

# Qwen/Qwen2-VL-*-Instruct and Qwen/Qwen2.5-VL-*-Instruct (chat_template.json)
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# llava-hf/llava-1.5-*-hf (chat_template.json)
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}"
    "{% endif %}{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}"
    "{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# HuggingFaceTB/SmolVLM-*-Instruct (chat_template.json; Idefics3ForConditionalGeneration)
SMOLVLM_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------

def f32(x):
    """float32 value -> shortest decimal that round-trips to the same float32."""
    return float(str(np.float32(x)))


def f32list(t):
    a = t.detach().to(torch.float32).cpu().numpy() if torch.is_tensor(t) else np.asarray(t, dtype=np.float32)
    return [float(str(x)) for x in a.reshape(-1)]  # str(np.float32): shortest round-trip decimal


def tensor_entry(t):
    t = t.detach().to(torch.float32).cpu()
    return {"shape": list(t.shape), "values": f32list(t)}


def intlist(t):
    return [int(v) for v in (t.reshape(-1).tolist() if torch.is_tensor(t) else np.asarray(t).reshape(-1).tolist())]


def dump_json(obj, path):
    s = json.dumps(obj, indent=2, ensure_ascii=False)
    # put arrays of plain numbers on one line
    s = re.sub(r"\[\s+([-+0-9eE.,\s]+?)\s+\]", lambda m: "[" + re.sub(r"\s+", "", m.group(1)) + "]", s)
    Path(path).write_text(s + "\n", encoding="utf-8")


def sha256_file(p):
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def versions():
    return {
        "python": platform.python_version(),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
    }


def jsonable_kwargs(kw):
    out = {}
    for k, v in kw.items():
        if isinstance(v, PILImageResampling):
            out[k] = v.name
            out[k + "_pil_value"] = int(v.value)
        elif isinstance(v, (tuple, list)):
            out[k] = [float(x) if isinstance(x, float) else x for x in v]
        else:
            out[k] = v
    return out


# --------------------------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------------------------

def make_tokenizer(base_path, specials, bos=None, eos=None, pad=None, unk=None, add_bos=False, extra=None):
    """Base BPE (ids 0..1023: bytes, merges, <|endoftext|> <|im_start|> <|im_end|>) + the family's specials."""
    tok = Tokenizer.from_file(str(base_path))
    assert tok.get_vocab_size() == 1024
    new = [t for t in specials if tok.token_to_id(t) is None]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in new])
    if add_bos:  # like Llama/Gemma tokenizers: BOS is prepended when add_special_tokens=True
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, tok.token_to_id(bos))]),
        ])
    kw = dict(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, unk_token=unk,
              model_max_length=4096, clean_up_tokenization_spaces=False)
    if extra:
        kw["extra_special_tokens"] = extra
    return PreTrainedTokenizerFast(**kw)


def fix_tokenizer_config(d, hf_tok, specials):
    """Like shared/fixtures/tiny-models: tokenizer_class PreTrainedTokenizerFast + added_tokens_decoder."""
    p = Path(d) / "tokenizer_config.json"
    cfg = json.loads(p.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    vocab = hf_tok.get_vocab()
    all_special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [t for t in specials if t not in
                                                                       ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    cfg["added_tokens_decoder"] = {
        str(vocab[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True}
        for t in sorted(all_special, key=lambda t: vocab[t])
    }
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------------------------
# random init
# --------------------------------------------------------------------------------------------------------------

def randomize_(model, seed, norm_base):
    """Overwrite every parameter (named_parameters() order, tied weights once) from a seeded generator.

    norm_base(name, module) -> base value for a norm weight (w = base + NORM_STD*N), or None if not a norm.
    Norm biases (LayerNorm) and linear/conv biases: BIAS_STD*N. Everything else: INIT_STD*N
    (Gemma's text embedding: GEMMA_EMBED_STD*N).
    """
    g = torch.Generator().manual_seed(seed)
    mods = dict(model.named_modules())
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            mod_name, _, pname = name.rpartition(".")
            mod = mods.get(mod_name)
            base = norm_base(name, mod) if pname == "weight" and p.ndim == 1 else None
            if base is not None:
                p.copy_(base + NORM_STD * noise)
            elif pname == "bias":
                p.copy_(BIAS_STD * noise)
            elif name.endswith("language_model.embed_tokens.weight") and "gemma" in type(model).__name__.lower():
                p.copy_(GEMMA_EMBED_STD * noise)
            else:
                p.copy_(INIT_STD * noise)


def is_norm(mod):
    return mod is not None and ("Norm" in type(mod).__name__ or isinstance(mod, torch.nn.LayerNorm))


# --------------------------------------------------------------------------------------------------------------
# families
# --------------------------------------------------------------------------------------------------------------

class Family:
    name = ""
    seed = 1234
    cls_name = ""
    chat_template = ""

    def __init__(self, base_tok):
        self.base_tok = base_tok

    # each family implements: build_tokenizer(), build_config(tok), generation_eos(tok), processor_config(),
    # image_processor_kwargs(), build_processor(tok), norm_base(name, module),
    # image_features(model, inputs) -> (dict of tensors to record, placeholder rows [n_tokens, text_hidden]),
    # loop_inputs(inputs) -> per-token input names to extend with 0 in the no-cache greedy loop


class Gemma3(Family):
    template_image_marker = '<start_of_image>'  # what the chat template writes for one image
    name = "gemma3"
    cls_name = "Gemma3ForConditionalGeneration"
    seed = 2  # picked among seeds 1..12: fewest repeated greedy tokens with a top1-top2 margin > 0.01
    chat_template = GEMMA3_CHAT_TEMPLATE
    specials = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    image_seq_length = 16  # mm_tokens_per_image: (32/4)^2 = 64 patches, avg-pooled 2x2 -> 4x4 = 16

    def build_tokenizer(self):
        return make_tokenizer(self.base_tok, self.specials, bos="<bos>", eos="<eos>", pad="<pad>", add_bos=True,
                              extra={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                                     "eoi_token": "<end_of_image>"})

    def build_config(self, tok):
        from transformers import Gemma3Config
        ids = tok.get_vocab()
        text = dict(
            vocab_size=len(ids), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
            sliding_window=16, layer_types=["sliding_attention", "full_attention"],
            hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None, attn_logit_softcapping=None,
            max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
            bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"], pad_token_id=ids["<pad>"], dtype="float32",
        )
        vision = dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_channels=3, image_size=32, patch_size=4, hidden_act="gelu_pytorch_tanh",
            layer_norm_eps=1e-6, attention_dropout=0.0, vision_use_head=False, dtype="float32",
        )
        cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=self.image_seq_length,
                           boi_token_index=ids["<start_of_image>"], eoi_token_index=ids["<end_of_image>"],
                           image_token_index=ids["<image_soft_token>"], tie_word_embeddings=True,
                           initializer_range=0.02, dtype="float32")
        cfg.architectures = [self.cls_name]
        return cfg

    def generation_eos(self, tok):
        return [tok.convert_tokens_to_ids("<eos>"), tok.convert_tokens_to_ids("<end_of_turn>")]

    def processor_config(self):
        return {"image_seq_length": self.image_seq_length}

    def image_processor_kwargs(self):
        return dict(size={"height": 32, "width": 32}, resample=PILImageResampling.BILINEAR, do_resize=True,
                    do_rescale=True, rescale_factor=1 / 255, do_normalize=True, image_mean=[0.5, 0.5, 0.5],
                    image_std=[0.5, 0.5, 0.5], do_convert_rgb=True, do_pan_and_scan=False)

    def build_processor(self, tok):
        from transformers import Gemma3ImageProcessorPil, Gemma3Processor
        return Gemma3Processor(image_processor=Gemma3ImageProcessorPil(**self.image_processor_kwargs()),
                               tokenizer=tok, chat_template=self.chat_template,
                               image_seq_length=self.image_seq_length)

    def norm_base(self, name, mod):
        if not is_norm(mod):
            return None
        if isinstance(mod, torch.nn.LayerNorm):  # SigLIP LayerNorms: y * w + b
            return 1.0
        # Gemma3RMSNorm multiplies by (1 + w): same scales as shared/fixtures/tiny-models/gemma3
        if name == "model.language_model.norm.weight":
            return 2.0
        if "post_attention_layernorm" in name or "post_feedforward_layernorm" in name:
            return 1.0
        return 0.0

    def image_features(self, model, inputs):
        m = model.model
        vt = m.vision_tower(pixel_values=inputs["pixel_values"], return_dict=True)
        feats = m.get_image_features(inputs["pixel_values"], return_dict=True).pooler_output
        return {
            "vision_tower_last_hidden_state": vt.last_hidden_state,  # after post_layernorm, [n_img, 64, 32]
            "image_features": feats,  # [n_img, 16, 64]
        }, feats.reshape(-1, feats.shape[-1])

    def loop_inputs(self, inputs):
        return ["token_type_ids"]


def _skip_none_video_processor_check():
    from transformers.processing_utils import ProcessorMixin
    if getattr(ProcessorMixin, "_vlm_fixture_patched", False):
        return
    orig = ProcessorMixin.check_argument_for_proper_class

    def check(self, argument_name, argument):
        if argument is None and argument_name == "video_processor":
            return None
        return orig(self, argument_name, argument)

    ProcessorMixin.check_argument_for_proper_class = check
    ProcessorMixin._vlm_fixture_patched = True


class Qwen25VL(Family):
    template_image_marker = '<|vision_start|><|image_pad|><|vision_end|>'  # the chat template's text for one image
    name = "qwen2_5_vl"
    cls_name = "Qwen2_5_VLForConditionalGeneration"
    seed = 1234
    chat_template = QWEN2_VL_CHAT_TEMPLATE
    specials = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

    def build_tokenizer(self):
        return make_tokenizer(self.base_tok, self.specials, bos=None, eos="<|im_end|>", pad="<|endoftext|>",
                              extra={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                     "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"})

    def build_config(self, tok):
        from transformers import Qwen2_5_VLConfig
        ids = tok.get_vocab()
        text = dict(
            vocab_size=len(ids), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=512,
            rms_norm_eps=1e-6, use_sliding_window=False, sliding_window=None, max_window_layers=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]},
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
            tie_word_embeddings=False, dtype="float32",
        )
        vision = dict(
            depth=4, hidden_size=32, hidden_act="silu", intermediate_size=64, num_heads=2, in_channels=3,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2, tokens_per_second=2, window_size=56,
            out_hidden_size=64, fullatt_block_indexes=[1, 3], initializer_range=0.02, dtype="float32",
        )
        cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                               image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                               vision_start_token_id=ids["<|vision_start|>"],
                               vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
                               dtype="float32")
        cfg.architectures = [self.cls_name]
        return cfg

    def generation_eos(self, tok):
        return [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]

    def processor_config(self):
        return {}

    def image_processor_kwargs(self):
        # as daemon/tests/fixtures/vision/qwen2_5_vl.json (tiny max_pixels)
        return dict(patch_size=14, temporal_patch_size=2, merge_size=2, min_pixels=56 * 56,
                    max_pixels=28 * 28 * 16, image_mean=list(OPENAI_CLIP_MEAN), image_std=list(OPENAI_CLIP_STD),
                    resample=PILImageResampling.BICUBIC, do_resize=True, do_rescale=True, rescale_factor=1 / 255,
                    do_normalize=True, do_convert_rgb=True)

    def build_processor(self, tok):
        from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil
        # No video processor: transformers' video processors need torchvision (not installed; images do not).
        # ProcessorMixin's class check of the None video_processor looks up BaseVideoProcessor, which without
        # torchvision fails with AttributeError; skip that one check (see _skip_none_video_processor_check).
        _skip_none_video_processor_check()
        return Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessorPil(**self.image_processor_kwargs()),
                                   tokenizer=tok, video_processor=None, chat_template=self.chat_template)

    def norm_base(self, name, mod):
        return 1.0 if is_norm(mod) else None  # Qwen2RMSNorm / vision RMSNorm / ln_q: y * w

    def image_features(self, model, inputs):
        from transformers.vision_utils import get_vision_position_ids, get_vision_window_index
        m = model.model
        vc = model.config.vision_config
        thw = inputs["image_grid_thw"]
        out = m.get_image_features(inputs["pixel_values"], thw, return_dict=True)
        feats = list(out.pooler_output)
        window_index, cu_window = get_vision_window_index(thw, vc.spatial_merge_size, vc.window_size, vc.patch_size)
        pos = get_vision_position_ids(thw, vc.spatial_merge_size)
        return {
            "image_features": feats,  # list of [tokens_i, 64], in token (row-major merged-grid) order
            "vision_rope_position_ids_hw": pos,  # [num_patches, 2] (h, w) per patch row of pixel_values
            "window_index": window_index,  # merged-unit order used inside the vision blocks
            "cu_window_seqlens": cu_window,
        }, torch.cat(feats, 0)

    def loop_inputs(self, inputs):
        return ["mm_token_type_ids"]


class Llava(Family):
    template_image_marker = '<image>'  # what the chat template writes for one image
    name = "llava"
    cls_name = "LlavaForConditionalGeneration"
    seed = 1234
    chat_template = LLAVA_CHAT_TEMPLATE
    specials = ["<unk>", "<s>", "</s>", "<image>", "<pad>"]

    def build_tokenizer(self):
        return make_tokenizer(self.base_tok, self.specials, bos="<s>", eos="</s>", pad="<pad>", unk="<unk>",
                              add_bos=True, extra={"image_token": "<image>"})

    def build_config(self, tok):
        from transformers import LlavaConfig
        ids = tok.get_vocab()
        text = dict(
            model_type="llama", vocab_size=len(ids), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, hidden_act="silu", max_position_embeddings=512,
            rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["<pad>"],
            tie_word_embeddings=False, dtype="float32",
        )
        vision = dict(
            model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=2, num_channels=3, image_size=24, patch_size=4, hidden_act="quick_gelu",
            layer_norm_eps=1e-5, projection_dim=32, dtype="float32",
        )
        cfg = LlavaConfig(text_config=text, vision_config=vision, image_token_index=ids["<image>"],
                          projector_hidden_act="gelu", vision_feature_select_strategy="default",
                          vision_feature_layer=-2, image_seq_length=36, multimodal_projector_bias=True,
                          tie_word_embeddings=False, dtype="float32")
        cfg.architectures = [self.cls_name]
        return cfg

    def generation_eos(self, tok):
        return [tok.convert_tokens_to_ids("</s>")]

    def processor_config(self):
        return {"patch_size": 4, "vision_feature_select_strategy": "default", "image_token": "<image>",
                "num_additional_image_tokens": 1}

    def image_processor_kwargs(self):
        # as daemon/tests/fixtures/vision/llava.json
        return dict(size={"shortest_edge": 24}, crop_size={"height": 24, "width": 24},
                    resample=PILImageResampling.BICUBIC, do_resize=True, do_center_crop=True, do_rescale=True,
                    rescale_factor=1 / 255, do_normalize=True, image_mean=list(OPENAI_CLIP_MEAN),
                    image_std=list(OPENAI_CLIP_STD), do_convert_rgb=True)

    def build_processor(self, tok):
        from transformers import CLIPImageProcessorPil, LlavaProcessor
        return LlavaProcessor(image_processor=CLIPImageProcessorPil(**self.image_processor_kwargs()),
                              tokenizer=tok, patch_size=4, vision_feature_select_strategy="default",
                              chat_template=self.chat_template, image_token="<image>",
                              num_additional_image_tokens=1)

    def norm_base(self, name, mod):
        return 1.0 if is_norm(mod) else None  # CLIP LayerNorms (incl. "pre_layrnorm"), Llama RMSNorm

    def image_features(self, model, inputs):
        m = model.model
        vt = m.vision_tower(inputs["pixel_values"], output_hidden_states=True, return_dict=True)
        feats = m.get_image_features(inputs["pixel_values"], vision_feature_layer=-2,
                                     vision_feature_select_strategy="default", return_dict=True).pooler_output
        feats = torch.stack(list(feats), 0)
        return {
            "vision_hidden_states_minus2": vt.hidden_states[-2],  # [n_img, 37, 32]: CLS + 36 patches
            "image_features": feats,  # projector(hidden_states[-2][:, 1:]) [n_img, 36, 64]
        }, feats.reshape(-1, feats.shape[-1])

    def loop_inputs(self, inputs):
        return []


class SmolVLM(Family):
    template_image_marker = '<image>'  # what the chat template writes for one image
    name = "smolvlm"
    cls_name = "Idefics3ForConditionalGeneration"
    seed = 4  # seed 1234 gave a top1-top2 greedy margin of 0.004; seeds 1..6 tried
    chat_template = SMOLVLM_CHAT_TEMPLATE
    specials = (["<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>"]
                + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)])
    image_seq_len = 16  # ((32 / 4) ** 2) / scale_factor**2 = 64 / 4

    def build_tokenizer(self):
        return make_tokenizer(self.base_tok, self.specials, bos="<|im_start|>", eos="<end_of_utterance>",
                              pad="<|endoftext|>", extra={"image_token": "<image>"})

    def build_config(self, tok):
        from transformers import Idefics3Config
        ids = tok.get_vocab()
        text = dict(
            model_type="llama", vocab_size=len(ids), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=512,
            rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
            bos_token_id=ids["<|im_start|>"], eos_token_id=ids["<end_of_utterance>"],
            pad_token_id=ids["<|endoftext|>"], tie_word_embeddings=False, dtype="float32",
        )
        vision = dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_channels=3,
            image_size=32, patch_size=4, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, dtype="float32",
        )
        cfg = Idefics3Config(text_config=text, vision_config=vision, image_token_id=ids["<image>"],
                             scale_factor=2, tie_word_embeddings=False, pad_token_id=ids["<|endoftext|>"],
                             dtype="float32")
        cfg.architectures = [self.cls_name]
        return cfg

    def generation_eos(self, tok):
        return [tok.convert_tokens_to_ids("<end_of_utterance>")]

    def processor_config(self):
        return {"image_seq_len": self.image_seq_len}

    def image_processor_kwargs(self):
        # as daemon/tests/fixtures/vision/idefics3.json (first variant: longest edge 64, 32 px tiles)
        return dict(resample=PILImageResampling.LANCZOS, do_resize=True, do_image_splitting=True, do_rescale=True,
                    rescale_factor=1 / 255, do_normalize=True, image_mean=[0.5, 0.5, 0.5],
                    image_std=[0.5, 0.5, 0.5], do_convert_rgb=True, do_pad=True, size={"longest_edge": 64},
                    max_image_size={"longest_edge": 32})

    def build_processor(self, tok):
        from transformers import Idefics3ImageProcessorPil, Idefics3Processor
        return Idefics3Processor(image_processor=Idefics3ImageProcessorPil(**self.image_processor_kwargs()),
                                 tokenizer=tok, image_seq_len=self.image_seq_len, chat_template=self.chat_template)

    def norm_base(self, name, mod):
        return 1.0 if is_norm(mod) else None

    def image_features(self, model, inputs):
        m = model.model
        out = m.get_image_features(inputs["pixel_values"], inputs.get("pixel_attention_mask"), return_dict=True)
        feats = torch.cat(list(out.pooler_output), 0)
        return {
            "vision_last_hidden_state": out.last_hidden_state,  # [n_tiles, 64, 32] after post_layernorm
            "image_features": feats,  # [n_tiles * 16, 64]: pixel shuffle (scale 2) + modality projection
        }, feats

    def loop_inputs(self, inputs):
        return []


FAMILIES = {c.name: c for c in (Gemma3, Qwen25VL, Llava, SmolVLM)}


# --------------------------------------------------------------------------------------------------------------
# references
# --------------------------------------------------------------------------------------------------------------

def cases():
    g, n = IMAGES
    return [
        {"name": "grad", "images": [g],
         "messages": [{"role": "user", "content": [{"type": "image", "path": g},
                                                   {"type": "text", "text": PROMPT_TEXT}]}]},
        {"name": "noise", "images": [n],
         "messages": [{"role": "user", "content": [{"type": "image", "path": n},
                                                   {"type": "text", "text": PROMPT_TEXT}]}]},
        {"name": "both", "images": [g, n],
         "messages": [{"role": "user", "content": [{"type": "image", "path": g}, {"type": "image", "path": n},
                                                   {"type": "text", "text": PROMPT_TEXT_2}]}]},
    ]


def with_paths(messages):
    out = []
    for m in messages:
        c = []
        for part in m["content"]:
            part = dict(part)
            if part.get("type") == "image":
                part["path"] = str(IMAGE_DIR / part["path"])
            c.append(part)
        out.append({"role": m["role"], "content": c})
    return out


def model_inputs(inputs):
    return {k: v for k, v in inputs.items() if k not in ("num_crops", "rows", "cols")}


@torch.no_grad()
def forward_logits(model, inputs):
    return model(**model_inputs(inputs), use_cache=False).logits[0].float()


@torch.no_grad()
def greedy_manual(model, inputs, extend_keys, n):
    """No-cache greedy: full recomputation each step (token-type style inputs extended with 0)."""
    cur = {k: v for k, v in model_inputs(inputs).items()}
    new, margins, tops = [], [], []
    for _ in range(n):
        last = model(**cur, use_cache=False).logits[0, -1].float()
        top = torch.topk(last, 5)
        margins.append(f32(top.values[0] - top.values[1]))
        tops.append({"ids": [int(i) for i in top.indices], "logits": f32list(top.values)})
        nxt = int(top.indices[0])
        new.append(nxt)
        cur["input_ids"] = torch.cat([cur["input_ids"], torch.tensor([[nxt]])], 1)
        if "attention_mask" in cur:
            cur["attention_mask"] = torch.cat([cur["attention_mask"], torch.ones(1, 1, dtype=cur["attention_mask"].dtype)], 1)
        for k in extend_keys:
            if k in cur:
                cur[k] = torch.cat([cur[k], torch.zeros(1, 1, dtype=cur[k].dtype)], 1)
    return new, margins, tops


def load_pil(name):
    im = Image.open(IMAGE_DIR / name)
    im.load()
    return im


def vision_fixture_pixel_values(family, image):
    """pixel_values recorded for the same image + settings by scripts/make-vision-fixtures.py, if any."""
    fname = {"gemma3": "gemma3.json", "qwen2_5_vl": "qwen2_5_vl.json", "llava": "llava.json",
             "smolvlm": "idefics3.json"}[family]
    p = VISION_FIXTURES / fname
    if not p.exists():
        return None
    obj = json.loads(p.read_text())
    for c in obj["cases"]:
        if c["image"] == image and (family != "smolvlm" or c["kwargs"]["size"]["longest_edge"] == 64):
            return np.array(c["pixel_values"], dtype=np.float32).reshape(c["pixel_values_shape"])
    return None


def hubify_checkpoint(fam, d):
    """Rename tensors to the layout of the families' Hub checkpoints (transformers 5.24 saves SigLIP/CLIP
    towers without their `vision_model.` level; it strips that level again when loading, see
    conversion_mapping.py "CLIPVisionModel": PrefixChange(prefix_to_remove="vision_model"))."""
    p = d / "model.safetensors"
    t = load_file(str(p))
    renames = {}
    for k in t:
        nk = k
        if fam.name in ("gemma3", "llava") and k.startswith("vision_tower.") and not k.startswith(
                "vision_tower.vision_model."):
            nk = "vision_tower.vision_model." + k[len("vision_tower."):]
        renames[k] = nk
    if any(k != v for k, v in renames.items()):
        from safetensors.torch import save_file
        save_file({renames[k]: v.contiguous() for k, v in t.items()}, str(p), metadata={"format": "pt"})
    return sorted(renames.values())


def make_family(fam, out_dir):
    d = out_dir / fam.name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)

    # ---- tokenizer, processor, model; save everything
    tok = fam.build_tokenizer()
    processor = fam.build_processor(tok)
    config = fam.build_config(tok)
    torch.manual_seed(fam.seed)
    model = getattr(transformers, fam.cls_name)(config).eval()
    randomize_(model, fam.seed, fam.norm_base)
    model.generation_config = GenerationConfig(
        bos_token_id=config.get_text_config().bos_token_id, eos_token_id=fam.generation_eos(tok),
        pad_token_id=config.get_text_config().pad_token_id)
    model.save_pretrained(d, safe_serialization=True)
    hubify_checkpoint(fam, d)
    # processor files written one by one (Hub layout): tokenizer, preprocessor_config.json (image processor),
    # processor_config.json (processor-level kwargs), chat_template.jinja
    tok.save_pretrained(d)
    fix_tokenizer_config(d, tok, fam.specials)
    processor.image_processor.save_pretrained(d)
    pcfg = dict(fam.processor_config(), processor_class=type(processor).__name__)
    (d / "processor_config.json").write_text(json.dumps(pcfg, indent=2, sort_keys=True) + "\n")
    (d / "chat_template.jinja").write_text(fam.chat_template, encoding="utf-8")
    for extra in ["special_tokens_map.json"]:
        if (d / extra).exists():
            (d / extra).unlink()
    for p in d.iterdir():
        p.chmod(0o644)

    # ---- everything below uses the files on disk (processor rebuilt from explicit kwargs + the saved tokenizer)
    cls = getattr(transformers, fam.cls_name)
    ref_model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    sd_mem, sd_disk = model.state_dict(), ref_model.state_dict()
    assert sd_mem.keys() == sd_disk.keys(), set(sd_mem) ^ set(sd_disk)
    for k in sd_mem:
        assert torch.equal(sd_mem[k], sd_disk[k]), k
    disk_tok = transformers.AutoTokenizer.from_pretrained(d)
    assert disk_tok.get_vocab() == tok.get_vocab()
    proc = fam.build_processor(disk_tok)
    assert proc.chat_template == fam.chat_template
    auto_proc = None
    if fam.name != "qwen2_5_vl":  # Qwen2_5_VLProcessor.from_pretrained also loads a video processor (torchvision)
        auto_proc = transformers.AutoProcessor.from_pretrained(d)
        assert type(auto_proc) is type(proc) and type(auto_proc.image_processor) is type(proc.image_processor)

    tensors_on_disk = load_file(str(d / "model.safetensors"))
    text_cfg = ref_model.config.get_text_config()
    vocab = text_cfg.vocab_size
    image_token_id = int(ref_model.config.image_token_id)

    ref = {
        "family": fam.name,
        "architecture": fam.cls_name,
        "model_type": ref_model.config.model_type,
        "dtype": "float32",
        "attn_implementation": "eager",
        "note": "transformers on CPU, float32; float lists are float32 values (shortest decimal that round-trips). "
                "Tensors are {shape, values} with values flattened in row-major order.",
        "versions": versions(),
        "init_seed": fam.seed,
        "base_tokenizer_sha256": BASE_TOKENIZER_SHA256,
        "processor_class": type(proc).__name__,
        "autoprocessor_from_directory_gives_same_inputs": auto_proc is not None,
        "image_processor_class": type(proc.image_processor).__name__,
        "image_processor_kwargs": jsonable_kwargs(fam.image_processor_kwargs()),
        "template_image_marker": fam.template_image_marker,
        "image_token": disk_tok.convert_ids_to_tokens(image_token_id),
        "image_token_id": image_token_id,
        "special_token_ids": {t: int(disk_tok.convert_tokens_to_ids(t)) for t in fam.specials},
        "vocab_size": vocab,
        "num_parameters": sum(p.numel() for p in ref_model.parameters()),
        "tensor_shapes": {k: list(v.shape) for k, v in sorted(tensors_on_disk.items())},
        "cases": [],
    }
    if fam.name == "gemma3":
        ref["processor_settings"] = {"image_seq_length": proc.image_seq_length,
                                     "full_image_sequence": proc.full_image_sequence,
                                     "boi_token": proc.boi_token, "processor_image_token": proc.image_token}
    elif fam.name == "llava":
        ref["processor_settings"] = {"patch_size": proc.patch_size, "num_additional_image_tokens": 1,
                                     "vision_feature_select_strategy": "default"}
    elif fam.name == "smolvlm":
        ref["processor_settings"] = {"image_seq_len": proc.image_seq_len,
                                     "fake_image_token": proc.fake_image_token,
                                     "global_image_tag": proc.global_image_tag}
    elif fam.name == "qwen2_5_vl":
        ref["processor_settings"] = {"merge_size": proc.image_processor.merge_size,
                                     "resolved_size": dict(proc.image_processor.size)}

    numerics = {"max_abs_diff_vs_sdpa": 0.0, "max_abs_diff_fp32_vs_fp64": 0.0, "max_abs_logit": 0.0,
                "max_abs_diff_embeds_merge_by_hand": 0.0}
    f64 = cls.from_pretrained(d, dtype=torch.float64, attn_implementation="eager").eval()
    sdpa = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa").eval()
    sensitivity = {}
    single_pv, single_feats = {}, {}
    for case in cases():
        msgs = with_paths(case["messages"])
        rendered = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        inputs = proc.apply_chat_template(msgs, tokenize=True, return_dict=True, add_generation_prompt=True,
                                          return_tensors="pt")
        # the same through a plain processor call on Image.open() images
        add_special = not (disk_tok.bos_token is not None and rendered.startswith(disk_tok.bos_token))
        direct = proc(text=[rendered], images=[[load_pil(n) for n in case["images"]]] if fam.name in
                      ("gemma3", "smolvlm") else [load_pil(n) for n in case["images"]],
                      return_tensors="pt", add_special_tokens=add_special)
        assert direct.keys() == inputs.keys(), (direct.keys(), inputs.keys())
        for k in inputs:
            assert torch.equal(torch.as_tensor(direct[k]), torch.as_tensor(inputs[k])), (fam.name, case["name"], k)
        if auto_proc is not None:  # the same from the files on disk alone (AutoProcessor.from_pretrained(dir))
            auto_inputs = auto_proc.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                                        add_generation_prompt=True, return_tensors="pt")
            assert auto_inputs.keys() == inputs.keys()
            for k in inputs:
                assert torch.equal(torch.as_tensor(auto_inputs[k]), torch.as_tensor(inputs[k])), (fam.name, k)
        ids = inputs["input_ids"][0]
        T = int(ids.shape[0])
        pv = inputs["pixel_values"]
        ent = {
            "name": case["name"],
            "images": case["images"],
            "messages": case["messages"],
            "add_generation_prompt": True,
            "rendered_prompt": rendered,
            "tokenized_with_add_special_tokens": add_special,
            "input_ids": intlist(ids),
            "seq_len": T,
            "image_token_positions": [i for i, t in enumerate(ids.tolist()) if t == image_token_id],
            "num_image_tokens": int((ids == image_token_id).sum()),
        }
        if "token_type_ids" in inputs:
            ent["token_type_ids"] = intlist(inputs["token_type_ids"][0])
        if "mm_token_type_ids" in inputs:
            ent["mm_token_type_ids"] = intlist(inputs["mm_token_type_ids"][0])
        single_pv[case["name"]] = pv
        if len(case["images"]) == 1:
            ent["pixel_values"] = tensor_entry(pv)
        else:  # the two-image prompt: pixel_values are the single-image ones, concatenated (checked, not written)
            cat_dim = 1 if fam.name == "smolvlm" else 0
            assert torch.equal(pv, torch.cat([single_pv[n] for n in ("grad", "noise")], cat_dim))
            ent["pixel_values"] = {"shape": list(pv.shape), "values": None,
                                   "note": f"= concatenation along dim {cat_dim} of the grad and noise cases' "
                                           "pixel_values (checked by the generator, values not repeated here)"}
        for k in ("image_grid_thw", "rows", "cols", "num_crops"):
            if k in inputs:
                ent[k] = [list(map(int, np.asarray(r).reshape(-1))) for r in inputs[k]] if k in ("rows", "cols") \
                    else torch.as_tensor(inputs[k]).tolist()
        if fam.name == "smolvlm":  # rows/cols of the tile grid (Idefics3Processor uses them but does not return them)
            rc = proc.image_processor([[load_pil(n) for n in case["images"]]], return_row_col_info=True,
                                      return_tensors="np")
            ent["rows"], ent["cols"] = [int(v) for v in rc["rows"][0]], [int(v) for v in rc["cols"][0]]
            assert np.array_equal(rc["pixel_values"], pv.numpy())
        if "pixel_attention_mask" in inputs:
            pam = inputs["pixel_attention_mask"]
            ent["pixel_attention_mask_shape"] = list(pam.shape)
            ent["pixel_attention_mask_all_ones"] = bool(pam.all())
        # pixel values equal to the vision fixtures made by scripts/make-vision-fixtures.py (same settings)
        if len(case["images"]) == 1:
            vf = vision_fixture_pixel_values(fam.name, case["images"][0])
            if vf is not None:
                got = pv.numpy().reshape(vf.shape) if fam.name != "smolvlm" else pv.numpy()
                assert got.shape == vf.shape and np.array_equal(got, vf), (fam.name, case["name"])
                ent["pixel_values_equal_to_vision_fixture"] = True

        with torch.no_grad():
            recs, flat_feats = fam.image_features(ref_model, inputs)
        for k, v in recs.items():
            if len(case["images"]) > 1 and k not in ("image_features",):
                continue  # intermediates for the two-image prompt: per image the same as in the single cases
            if isinstance(v, list):
                ent[k] = [tensor_entry(x) for x in v]
            elif v.dtype in (torch.int32, torch.int64):
                ent[k] = {"shape": list(v.shape), "values": intlist(v)}
            else:
                ent[k] = tensor_entry(v)
        assert flat_feats.shape[0] == ent["num_image_tokens"], (flat_feats.shape, ent["num_image_tokens"])
        single_feats[case["name"]] = flat_feats
        if len(case["images"]) > 1:  # each image is encoded on its own: same features as in the single cases
            diff = (flat_feats - torch.cat([single_feats["grad"], single_feats["noise"]], 0)).abs().max()
            ent["image_features_max_abs_diff_vs_single_image_cases"] = f32(diff)
            assert diff < 1e-4, diff

        # M-RoPE positions (Qwen2.5-VL)
        if fam.name == "qwen2_5_vl":
            with torch.no_grad():
                pos, deltas = ref_model.model.get_rope_index(
                    inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                    image_grid_thw=inputs["image_grid_thw"], attention_mask=inputs["attention_mask"])
            ent["mrope_position_ids"] = {"shape": list(pos.shape), "values": intlist(pos)}
            ent["rope_deltas"] = intlist(deltas)

        # the placeholder merge done by hand: embed text, overwrite placeholder rows with the features
        with torch.no_grad():
            emb = ref_model.get_input_embeddings()(ids[None])
            mask = (ids == image_token_id)
            emb2 = emb.clone()
            emb2[0, mask] = flat_feats.to(emb.dtype)
            kw = {k: v for k, v in model_inputs(inputs).items() if k not in ("input_ids", "pixel_values",
                                                                                "pixel_attention_mask")}
            if fam.name == "qwen2_5_vl":
                kw.pop("image_grid_thw")
                kw.pop("mm_token_type_ids")
                kw["position_ids"] = pos
            lg_hand = ref_model(inputs_embeds=emb2, use_cache=False, **kw).logits[0].float()

        lg = forward_logits(ref_model, inputs)
        numerics["max_abs_diff_embeds_merge_by_hand"] = max(numerics["max_abs_diff_embeds_merge_by_hand"],
                                                           float((lg_hand - lg).abs().max()))
        numerics["max_abs_logit"] = max(numerics["max_abs_logit"], float(lg.abs().max()))
        ent["last_logits"] = f32list(lg[-1])
        if case["name"] in ALL_LOGITS_CASES:
            if T * vocab <= ALL_LOGITS_MAX_FLOATS:
                ent["all_logits"] = {"shape": list(lg.shape), "values": f32list(lg)}
            else:
                ent["tail_logits"] = {"first_position": T - TAIL_POSITIONS, "shape": [TAIL_POSITIONS, vocab],
                                      "values": f32list(lg[T - TAIL_POSITIONS:])}

        # greedy decoding: generate (KV cache) == no-cache argmax loop
        manual, margins, tops = greedy_manual(ref_model, inputs, fam.loop_inputs(inputs), MAX_NEW_TOKENS)
        gen_cfg = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=0, do_sample=False, num_beams=1,
                                   eos_token_id=None, pad_token_id=text_cfg.pad_token_id, bos_token_id=None)
        ref_model.generation_config.eos_token_id = None
        with torch.no_grad():
            out = ref_model.generate(**model_inputs(inputs), generation_config=gen_cfg)
        gen = out[0, T:].tolist()
        assert gen == manual, (fam.name, case["name"], gen, manual)
        ent["greedy"] = {
            "max_new_tokens": MAX_NEW_TOKENS, "stop_at_eos": False, "new_token_ids": gen,
            "top1_minus_top2_logit_per_step": margins, "top5_per_step": tops,
        }
        if fam.name == "qwen2_5_vl":
            full = torch.cat([inputs["input_ids"], out[:, T:]], 1)
            tt = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, MAX_NEW_TOKENS, dtype=torch.long)], 1)
            with torch.no_grad():
                pos_full, _ = ref_model.model.get_rope_index(full, mm_token_type_ids=tt,
                                                             image_grid_thw=inputs["image_grid_thw"])
            ent["greedy"]["mrope_position_ids_of_new_tokens"] = intlist(pos_full[0, 0, T:])
            assert all(int(pos_full[c, 0, T + k]) == T + k + ent["rope_deltas"][0]
                       for c in range(3) for k in range(MAX_NEW_TOKENS))

        # noise floor and sensitivities
        with torch.no_grad():
            inp64 = {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v)
                     for k, v in model_inputs(inputs).items()}
            lg64 = f64(**inp64, use_cache=False).logits[0]
            lgs = forward_logits(sdpa, inputs)
        numerics["max_abs_diff_fp32_vs_fp64"] = max(numerics["max_abs_diff_fp32_vs_fp64"],
                                                   float((lg64 - lg.double()).abs().max()))
        numerics["max_abs_diff_vs_sdpa"] = max(numerics["max_abs_diff_vs_sdpa"], float((lgs - lg).abs().max()))
        for key, val in family_sensitivity(fam, ref_model, d, inputs, lg).items():
            sensitivity[key] = max(sensitivity.get(key, 0.0), val)
        ref["cases"].append(ent)

    ref["numerics"] = {k: f32(v) for k, v in numerics.items()}
    ref["numerics"]["min_top1_top2_margin_in_greedy"] = min(
        min(c["greedy"]["top1_minus_top2_logit_per_step"]) for c in ref["cases"])
    ref["numerics"]["max_abs_logit_change_if"] = {k: f32(v) for k, v in sensitivity.items()}
    ref["numerics"]["note"] = (
        "max over all cases. vs_sdpa: same weights with attn_implementation='sdpa'; fp64: same weights in float64; "
        "embeds_merge_by_hand: logits from inputs_embeds built by embedding the prompt and overwriting the "
        "placeholder rows with image_features (must be ~0); max_abs_logit_change_if: how much the logits move "
        "when a detail is done wrong (see README)")
    dump_json(ref, d / "reference.json")
    (d / "reference.json").chmod(0o644)
    sizes = {p.name: p.stat().st_size for p in sorted(d.iterdir())}
    return {"family": fam.name, "files": sizes, "total_bytes": sum(sizes.values()),
            "n_params": ref["num_parameters"], "greedy": {c["name"]: c["greedy"]["new_token_ids"] for c in ref["cases"]},
            "numerics": ref["numerics"]}


@torch.no_grad()
def family_sensitivity(fam, model, d, inputs, lg):
    out = {}
    mi = model_inputs(inputs)
    if fam.name == "gemma3":
        # image tokens attending causally only (token_type_ids dropped => no bidirectional block)
        alt = {k: v for k, v in mi.items() if k != "token_type_ids"}
        out["image_attention_causal_instead_of_bidirectional"] = float(
            (model(**alt, use_cache=False).logits[0] - lg).abs().max())
        # image features inserted scaled by sqrt(hidden) like text embeddings
        m = model.model
        ids = mi["input_ids"]
        feats = m.get_image_features(mi["pixel_values"], return_dict=True).pooler_output
        emb = model.get_input_embeddings()(ids)
        emb[ids == model.config.image_token_id] = (feats.reshape(-1, feats.shape[-1])
                                                   * model.config.text_config.hidden_size ** 0.5)
        kw = {k: v for k, v in mi.items() if k not in ("input_ids", "pixel_values")}
        out["image_features_scaled_by_sqrt_hidden"] = float(
            (model(inputs_embeds=emb, use_cache=False, **kw).logits[0] - lg).abs().max())
    elif fam.name == "qwen2_5_vl":
        T = mi["input_ids"].shape[1]
        pos1d = torch.arange(T)[None]
        out["plain_1d_positions"] = float(
            (model(**mi, position_ids=pos1d.expand(3, 1, T), use_cache=False).logits[0] - lg).abs().max())
        alt = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
            d, dtype=torch.float32, attn_implementation="eager").eval()
        alt.model.visual.fullatt_block_indexes = list(range(alt.config.vision_config.depth))
        out["all_vision_blocks_full_attention"] = float((alt(**mi, use_cache=False).logits[0] - lg).abs().max())
        alt.model.visual.fullatt_block_indexes = []
        out["all_vision_blocks_window_attention"] = float((alt(**mi, use_cache=False).logits[0] - lg).abs().max())
    elif fam.name == "llava":
        out["vision_feature_layer_minus1"] = float(
            (model(**mi, vision_feature_layer=-1, use_cache=False).logits[0] - lg).abs().max())
    elif fam.name == "smolvlm":
        pass
    return out


# llama.cpp's converter, run on a fixture directory (optional, --gguf-out). Our locally trained vocabulary has a
# pre-tokenizer check hash unknown to the converter; its Split regex is Qwen2's, so answer "qwen2" then (the same
# patch as scripts/crosscheck-tiny-gguf.py).
GGUF_CONVERT = r"""
import runpy, sys
from pathlib import Path
lcpp, src, out, *extra = sys.argv[1:]
lcpp = Path(lcpp)
sys.path.insert(0, str(lcpp)); sys.path.insert(1, str(lcpp / "gguf-py"))
import conversion.base as base
orig = base.TextModel.get_vocab_base_pre
def vocab_pre(self, tokenizer):
    try:
        return orig(self, tokenizer)
    except NotImplementedError:
        return "qwen2"
base.TextModel.get_vocab_base_pre = vocab_pre
sys.argv = [str(lcpp / "convert_hf_to_gguf.py"), "--outtype", "f32", "--outfile", out, *extra, src]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
# what this llama.cpp's convert_hf_to_gguf.py cannot convert (see README)
GGUF_UNSUPPORTED = {("smolvlm", "text"): "Idefics3ForConditionalGeneration is registered for --mmproj only",
                    ("llava", "mmproj"): "vision model_type clip_vision_model unsupported (LLaVA-1.5 projectors "
                                         "go through tools/mtmd/legacy-models)"}


def convert_gguf(name, src, llama_cpp, out_dir):
    import subprocess
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for kind, extra, fname in (("text", [], f"{name}.gguf"), ("mmproj", ["--mmproj"], f"mmproj-{name}.gguf")):
        if (name, kind) in GGUF_UNSUPPORTED:
            results[kind] = "skipped: " + GGUF_UNSUPPORTED[(name, kind)]
            continue
        r = subprocess.run([sys.executable, "-c", GGUF_CONVERT, str(llama_cpp), str(src), str(out_dir / fname),
                            *extra], capture_output=True, text=True)
        if r.returncode != 0:
            results[kind] = "failed: " + r.stderr.strip().splitlines()[-1]
        else:
            results[kind] = f"{fname} {(out_dir / fname).stat().st_size} bytes"
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--base-tokenizer", type=Path, default=Path(os.environ.get("VLM_BASE_TOKENIZER",
                                                                             DEFAULT_BASE_TOKENIZER)))
    ap.add_argument("--gguf-out", type=Path, default=None,
                    help="also convert each family with llama.cpp's convert_hf_to_gguf.py into this folder")
    ap.add_argument("--llama-cpp", type=Path, default=Path.home() / ".cache/inferd/llamacpp-0.3.36/"
                    "llama_cpp_python-0.3.36/vendor/llama.cpp", help="llama.cpp source tree (for --gguf-out)")
    ap.add_argument("families", nargs="*", default=list(FAMILIES))
    args = ap.parse_args()
    if not args.base_tokenizer.exists():
        sys.exit(f"base tokenizer not found: {args.base_tokenizer} (shared/fixtures/tiny-models/llama/tokenizer.json)")
    got = sha256_file(args.base_tokenizer)
    if got != BASE_TOKENIZER_SHA256:
        sys.exit(f"base tokenizer sha256 {got} != expected {BASE_TOKENIZER_SHA256}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.families:
        fam = FAMILIES[name](args.base_tokenizer)
        info = make_family(fam, args.out)
        print(json.dumps(info), flush=True)
        if args.gguf_out is not None:
            print(json.dumps({"family": name, "gguf": convert_gguf(name, args.out / name, args.llama_cpp,
                                                                    args.gguf_out)}), flush=True)
    print("versions:", json.dumps(versions()))


if __name__ == "__main__":
    main()
