//! [`PrepareActor`]: the prepare pool. Renders templates and tokenizes prompts, builds
//! the request's sampling chains and hands it to the [`Placer`] (or, when it names
//! plugins, to the plugin pool first); also answers the `tokenize` / `detokenize`
//! messages.

use std::sync::Arc;
use std::time::Instant;

use actix::{Actor, Addr, Handler, Message, SyncContext};

use super::media::MediaStep;
use super::placement::Placer;
use super::plugins::{PluginSetupActor, SetupPlugins};
use super::prompt::{render, render_with_images, Prompt};
use super::vision::ProcessedImage;
use crate::error::InferError;
use crate::request::{CancelFlag, EventSender, GenerateRequest, PromptInput, SeqId, StreamEvent};
use crate::sampling::build::ChainParts;
use crate::sampling::constraint::LazyCompiler;
use crate::sampling::SamplerChain;
use crate::scheduler::Prepared;
use crate::tokenizer::TextTokenizer;

/// Prepare a validated generate request and submit it. Failures (template errors, bad
/// input, a schema that does not compile) go to the request's event channel as
/// `error`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Prepare {
    /// The engine id chosen by the connection.
    pub seq: SeqId,
    /// The validated request.
    pub request: GenerateRequest,
    /// The request's event channel.
    pub events: EventSender,
    /// The request's cancel flag.
    pub cancel: CancelFlag,
    /// When the connection accepted it.
    pub received_at: Instant,
    /// The lease on the request's LoRA adapter (`None`: the base model).
    pub adapter: Option<crate::adapters::AdapterLease>,
}

impl Prepare {
    /// The request as the scheduler takes it, with its prompt and its chains (choice
    /// 0's and the forks', as `SamplerChain::build` gives them).
    pub(super) fn into_prepared(
        self,
        prompt: Prompt,
        (chain, forks): (SamplerChain, Vec<SamplerChain>),
    ) -> Prepared {
        Prepared {
            seq: self.seq,
            client_id: self.request.client_id,
            prompt: prompt.ids,
            channels: prompt.channels,
            chain,
            sampling: self.request.sampling,
            events: self.events,
            cancel: self.cancel,
            received_at: self.received_at,
            cache: self.request.cache,
            disk_hit: None,
            forks,
            adapter: self.adapter,
            images: prompt.images,
        }
    }
}

/// Tokenize text (the `tokenize` message).
#[derive(Debug, Message)]
#[rtype(result = "Result<Vec<u32>, InferError>")]
pub struct Encode {
    /// The text.
    pub text: String,
    /// Whether special-token text maps to control ids.
    pub special: bool,
}

/// Detokenize ids (the `detokenize` message); control tokens are skipped.
#[derive(Debug, Message)]
#[rtype(result = "String")]
pub struct Decode {
    /// Token ids, each already checked to be `< vocab_size`.
    pub token_ids: Vec<u32>,
}

/// What every prepare worker reads: the model's tokenizer and id, the grammar
/// compiler, the media step.
pub struct PrepareShared {
    /// The model's tokenizer and chat template.
    pub tokenizer: Arc<TextTokenizer>,
    /// The model's id (`/v1/models`), for errors.
    pub model_id: String,
    /// Built on first use, shared by the pool.
    pub grammars: Arc<LazyCompiler>,
    /// Image reading and decoding under `[media]`.
    pub media: MediaStep,
    /// The prompt side of a vision-language model (`None`: the model has no vision
    /// tower, and images are refused before anything is read or decoded).
    pub vision: Option<super::vision::VisionPrompt>,
}

/// The prepare stage. Start with `SyncArbiter::start(n, ..)`.
pub struct PrepareActor {
    shared: Arc<PrepareShared>,
    placer: Arc<Placer>,
    plugin_setup: Addr<PluginSetupActor>,
    /// The image pool (one thread) that prepares requests with images for a
    /// vision-language model, so that decoding never holds up this pool's text
    /// requests; `None` in the image pool itself and for a text-only model.
    images: Option<Addr<PrepareActor>>,
}

impl PrepareActor {
    /// A prepare worker that submits through `placer`, or hands requests that name
    /// plugins to `plugin_setup`.
    pub fn new(
        shared: Arc<PrepareShared>,
        placer: Arc<Placer>,
        plugin_setup: Addr<PluginSetupActor>,
    ) -> Self {
        Self {
            shared,
            placer,
            plugin_setup,
            images: None,
        }
    }

    /// Hands requests with images to `pool` (see [`PrepareActor::images`]).
    pub fn with_image_pool(mut self, pool: Addr<PrepareActor>) -> Self {
        self.images = Some(pool);
        self
    }

    /// The request's images, decoded and through the model's processor. A model
    /// without a vision tower refuses the first image part, naming the model, before
    /// any image is read or decoded.
    fn media(&self, request: &GenerateRequest) -> Result<Vec<ProcessedImage>, InferError> {
        let PromptInput::Messages(messages) = &request.input else {
            return Ok(Vec::new());
        };
        let first = messages.iter().flat_map(|m| &m.images).next();
        match (first, &self.shared.vision) {
            (None, _) => Ok(Vec::new()),
            (Some(image), None) => Err(InferError::validation(format!(
                "{}: model {:?} takes no images (it has no vision tower; docs/vision.md lists \
                 the models that do)",
                image.at, self.shared.model_id
            ))),
            (Some(_), Some(vision)) => self
                .shared
                .media
                .decode_each(messages, |d| vision.process(&d)),
        }
    }
}

impl PrepareActor {
    /// The prompt ids, with the images placed among them.
    fn prompt(
        &self,
        req: &GenerateRequest,
        processed: Vec<ProcessedImage>,
    ) -> Result<Prompt, InferError> {
        let tok = &self.shared.tokenizer;
        let Some(vision) = self
            .shared
            .vision
            .as_ref()
            .filter(|_| !processed.is_empty())
        else {
            return render(tok, req);
        };
        let texts: Vec<String> = processed.iter().map(|p| p.text.clone()).collect();
        let mut prompt = render_with_images(tok, req, Some((vision.marker(), &texts)))?;
        prompt.images = vision.place(&prompt.ids, processed)?;
        Ok(prompt)
    }
}

impl Actor for PrepareActor {
    type Context = SyncContext<Self>;
}

impl Handler<Prepare> for PrepareActor {
    type Result = ();

    fn handle(&mut self, msg: Prepare, _ctx: &mut SyncContext<Self>) {
        if let (Some(pool), PromptInput::Messages(m)) = (&self.images, &msg.request.input) {
            if m.iter().any(|m| !m.images.is_empty()) {
                pool.do_send(msg);
                return;
            }
        }
        let images = match self.media(&msg.request) {
            Ok(d) => d,
            Err(e) => {
                refused(&msg, e);
                return;
            }
        };
        let prompt = match self.prompt(&msg.request, images) {
            Ok(p) => p,
            Err(e) => {
                refused(&msg, e);
                return;
            }
        };
        if !msg.request.plugins.is_empty() {
            // Built on the plugin pool, with their instances.
            self.plugin_setup.do_send(SetupPlugins {
                prepare: msg,
                prompt,
            });
            return;
        }
        let parts = ChainParts {
            vocab: self.shared.tokenizer.as_ref(),
            grammars: &self.shared.grammars,
            tools: msg.request.tools.as_ref(),
            tool_format: prompt.tool_format,
            channels: &prompt.channels,
            plugins: None,
        };
        match SamplerChain::build(&msg.request.sampling, &parts) {
            Ok(chains) => self.placer.submit(msg.into_prepared(prompt, chains)),
            Err(e) => refused(&msg, e),
        }
    }
}

/// Ends a request the prepare stage refused: logged (as the scheduler logs the
/// requests it rejects) and sent as its `error` event.
fn refused(msg: &Prepare, e: InferError) {
    tracing::warn!(id = %msg.request.client_id, error = %e.message, "request refused");
    let _ = msg.events.send(StreamEvent::Error(e));
}

impl Handler<Encode> for PrepareActor {
    type Result = Result<Vec<u32>, InferError>;

    fn handle(&mut self, msg: Encode, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.shared
            .tokenizer
            .encode(&msg.text, msg.special)
            .map_err(|e| InferError::validation(format!("text: {e}")))
    }
}

impl Handler<Decode> for PrepareActor {
    type Result = String;

    fn handle(&mut self, msg: Decode, _ctx: &mut SyncContext<Self>) -> String {
        self.shared.tokenizer.decode(&msg.token_ids)
    }
}
