//! Hugging Face vision-language checkpoints: which classes are read, where their text
//! model's configuration and tensors are, and which tensors belong to the vision side.
//!
//! transformers 5.24.0 nests the decoder's configuration under `text_config` and stores
//! its tensors under a prefix that depends on the class and on the version that saved
//! it (`language_model.model.*` as saved by 4.x and by 5.24's `save_pretrained` for
//! Gemma 3 and LLaVA, `model.language_model.*` in 5.x Hub layouts, `model.text_model.*`
//! for Idefics3). They are renamed here to the causal-LM names the text reader knows
//! (`model.*`, `lm_head.*`), and the vision side's to one spelling per family
//! (`vision_tower.*` and `multi_modal_projector.*`; Idefics3's `model.vision_model.*`
//! and `model.connector.*`).

use serde_json::Value;

use super::super::spec::Architecture;

/// A vision-language class this build reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VlmFamily {
    /// `Gemma3ForConditionalGeneration`: SigLIP, pooled projector.
    Gemma3,
    /// `LlavaForConditionalGeneration`: CLIP, MLP projector.
    Llava,
    /// `Idefics3ForConditionalGeneration` (SmolVLM): SigLIP per tile, pixel shuffle.
    Idefics3,
    /// `Qwen2_5_VLForConditionalGeneration`: window-attention ViT, patch merger,
    /// M-RoPE in the decoder.
    Qwen25Vl,
}

/// The supported classes, for messages.
pub const SUPPORTED_VLM: &str = "Gemma3ForConditionalGeneration, LlavaForConditionalGeneration, \
     Idefics3ForConditionalGeneration, Qwen2_5_VLForConditionalGeneration";

impl VlmFamily {
    /// From `config.json` `architectures[0]`.
    pub fn from_hf(class: &str) -> Option<Self> {
        Some(match class {
            "Gemma3ForConditionalGeneration" => Self::Gemma3,
            "LlavaForConditionalGeneration" => Self::Llava,
            "Idefics3ForConditionalGeneration" => Self::Idefics3,
            "Qwen2_5_VLForConditionalGeneration" => Self::Qwen25Vl,
            _ => return None,
        })
    }

    /// The decoder's architecture, from `text_config.model_type`.
    pub fn text_architecture(self, text_config: &Value) -> Result<Architecture, String> {
        let ty = text_config
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or(match self {
                Self::Gemma3 => "gemma3_text",
                Self::Llava | Self::Idefics3 => "llama",
                Self::Qwen25Vl => "qwen2_5_vl_text",
            });
        match ty {
            "gemma3_text" | "gemma3" => Ok(Architecture::Gemma3),
            "llama" | "mistral" => Ok(Architecture::Llama),
            "qwen2" | "qwen2_5_vl_text" | "qwen2_5_vl" => Ok(Architecture::Qwen2),
            "qwen3" => Ok(Architecture::Qwen3),
            "phi3" => Ok(Architecture::Phi3),
            other => Err(format!(
                "text model_type {other:?} is not supported (supported: gemma3_text, llama, \
                 mistral, qwen2, qwen3, phi3)"
            )),
        }
    }

    /// The canonical name of a stored tensor: the text model's under `model.` /
    /// `lm_head.`, the vision side's under its family's prefix.
    pub fn rename(self, name: &str) -> String {
        const MAP: &[(&str, &str)] = &[
            ("language_model.model.", "model."),
            ("language_model.lm_head.", "lm_head."),
            ("model.language_model.", "model."),
            ("model.text_model.", "model."),
            ("model.vision_tower.", "vision_tower."),
            ("model.multi_modal_projector.", "multi_modal_projector."),
            ("model.visual.", "visual."),
        ];
        for (from, to) in MAP {
            if let Some(rest) = name.strip_prefix(from) {
                return format!("{to}{rest}");
            }
        }
        name.to_string()
    }

    /// Prefixes of the vision side's canonical names.
    pub fn vision_prefixes(self) -> &'static [&'static str] {
        match self {
            Self::Gemma3 | Self::Llava => &["vision_tower.", "multi_modal_projector."],
            Self::Idefics3 => &["model.vision_model.", "model.connector."],
            Self::Qwen25Vl => &["visual."],
        }
    }
}

/// The decoder's configuration of a VLM's `config.json`: `text_config`, with the
/// top-level `tie_word_embeddings` where it has none.
pub fn text_config(root: &Value) -> Option<Value> {
    let mut t = root.get("text_config")?.clone();
    let obj = t.as_object_mut()?;
    if !obj.contains_key("tie_word_embeddings") {
        if let Some(tie) = root.get("tie_word_embeddings") {
            obj.insert("tie_word_embeddings".into(), tie.clone());
        }
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_every_layout_reach_the_text_and_vision_spellings() {
        let g = VlmFamily::Gemma3;
        assert_eq!(
            g.rename("language_model.model.layers.0.mlp.up_proj.weight"),
            "model.layers.0.mlp.up_proj.weight"
        );
        assert_eq!(
            g.rename("model.language_model.norm.weight"),
            "model.norm.weight"
        );
        assert_eq!(
            g.rename("model.vision_tower.vision_model.post_layernorm.bias"),
            "vision_tower.vision_model.post_layernorm.bias"
        );
        assert_eq!(g.rename("lm_head.weight"), "lm_head.weight");
        let i = VlmFamily::Idefics3;
        assert_eq!(
            i.rename("model.text_model.embed_tokens.weight"),
            "model.embed_tokens.weight"
        );
        assert_eq!(
            i.rename("model.connector.modality_projection.proj.weight"),
            "model.connector.modality_projection.proj.weight"
        );
        assert_eq!(
            VlmFamily::from_hf("LlavaForConditionalGeneration"),
            Some(VlmFamily::Llava)
        );
        assert_eq!(VlmFamily::from_hf("Qwen2VLForConditionalGeneration"), None);
        let err = VlmFamily::Llava
            .text_architecture(&serde_json::json!({"model_type": "mamba"}))
            .unwrap_err();
        assert!(err.contains("\"mamba\""), "{err}");
    }

    #[test]
    fn the_text_config_inherits_the_top_level_tie() {
        let root =
            serde_json::json!({"tie_word_embeddings": true, "text_config": {"hidden_size": 8}});
        let t = text_config(&root).expect("text_config");
        assert_eq!(t["tie_word_embeddings"], true);
        assert_eq!(t["hidden_size"], 8);
        assert!(text_config(&serde_json::json!({})).is_none());
    }
}
