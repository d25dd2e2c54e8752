// inferd's chat page: streams answers over the WebSocket protocol v1 (docs/protocol.md)
// on the same origin. No framework, no dependencies; served by the daemon itself.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "inferd.apiKey";
const STATS_BUSY_MS = 500;   // stats polls while an answer streams
const STATS_IDLE_MS = 5000;  // and while idle (other clients' load)
const RETRY_MS = 2000;

const ui = {
  conn: $("conn"), connText: $("conn-text"), model: $("model-name"), notice: $("notice"),
  transcript: $("transcript"), empty: $("empty"), composer: $("composer"), prompt: $("prompt"),
  send: $("send"), stop: $("stop"), newChat: $("new-chat"),
  attach: $("attach"), attachments: $("attachments"),
  settings: $("settings"), pluginList: $("plugin-list"), pluginsEmpty: $("plugins-empty"),
  modelPick: $("model"), loraScale: $("lora_scale"),
  keyForm: $("key-form"), sidebar: $("key-form").parentElement, key: $("api-key"), remember: $("remember-key"), keyStatus: $("key-status"),
};

const state = {
  ws: null,          // the open (or opening) WebSocket
  opened: false,     // whether it reached "open"
  history: [],       // finished turns: {role, content}
  images: [],        // attached to the next message: {name, url} (url: a data: URL)
  active: null,      // the answer being generated: {id, userText, el, text, reasoning, started}
  seq: 0,            // request ids: g1, g2, ...
  statsTimer: 0,      // the next stats poll
  statsPending: false,
  retryTimer: 0,
  refused: false,    // the key was refused: do not retry until the user changes it
};

// ---------- connection ----------

/** base64url without padding of the UTF-8 bytes of `text` (the `inferd.key.` subprotocol). */
function base64url(text) {
  let bin = "";
  for (const b of new TextEncoder().encode(text)) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function wsUrl() {
  const u = new URL("v1/ws", location.href);
  u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
  return u.href;
}

function setConn(kind, text) {
  ui.conn.dataset.state = kind;
  ui.connText.textContent = text;
}

function showNotice(text) {
  ui.notice.textContent = text;
  ui.notice.hidden = !text;
}

function authHeaders() {
  const key = ui.key.value;
  return key ? { Authorization: "Bearer " + key } : {};
}

/** Probes `GET /v1/models` with the key (tells a refused key from a daemon that is down
 * or loading, which a failed WebSocket cannot), then opens the socket. */
async function connect() {
  clearTimeout(state.retryTimer);
  dropSocket();
  state.refused = false;
  setConn("connecting", "Connecting…");
  let probe;
  try {
    probe = await fetch("v1/models", { headers: authHeaders(), cache: "no-store" });
  } catch (e) {
    setConn("offline", "Daemon unreachable");
    showNotice("Cannot reach the daemon; retrying…");
    retryLater();
    return;
  }
  if (probe.status === 401) {
    refuse(ui.key.value
      ? "connection refused: check the API key"
      : "connection refused: this daemon needs an API key");
    return;
  }
  if (probe.status === 503) {
    setConn("connecting", "Model loading…");
    showNotice("The model is still loading; retrying…");
    retryLater();
    return;
  }
  try {
    renderModels(await probe.json());
  } catch (e) { /* the list is refreshed after each answer */ }
  openSocket();
}

/** `GET /v1/models` again (adapters are loaded and unloaded at run time). */
async function refreshModels() {
  try {
    const r = await fetch("v1/models", { headers: authHeaders(), cache: "no-store" });
    if (r.ok) renderModels(await r.json());
  } catch (e) { /* kept as it was */ }
}

/** Shows the base model's name and fills the model picker: the base model first (value
 * "", no adapter sent), then each LoRA adapter (`parent` set). A chosen adapter that is
 * gone stays chosen, marked, so nothing switches silently: sending names it and the
 * daemon's `model_not_found` says what it serves. */
function renderModels(models) {
  const list = (models && Array.isArray(models.data)) ? models.data : [];
  const base = list.find((m) => m && m.parent == null);
  ui.model.textContent = (list[0] && list[0].id) || "";
  const chosen = ui.modelPick.value;
  const adapters = list.filter((m) => m && m.parent != null && typeof m.id === "string");
  const group = (label, options) => {
    const g = document.createElement("optgroup");
    g.label = label;
    g.append(...options);
    return g;
  };
  const groups = [group("Base model", [new Option(base ? base.id : "Base model", "")])];
  const loras = adapters.map((a) => {
    const opt = new Option(a.id, a.id);
    if (a.root) opt.title = a.root;
    return opt;
  });
  if (chosen && !adapters.some((a) => a.id === chosen)) loras.push(new Option(chosen + " (not loaded)", chosen));
  if (loras.length) groups.push(group("LoRA adapters", loras));
  ui.modelPick.replaceChildren(...groups);
  ui.modelPick.value = chosen;
  syncScale();
}

/** The scale applies to an adapter only. */
function syncScale() {
  ui.loraScale.disabled = !ui.modelPick.value;
}

function refuse(message) {
  state.refused = true;
  setConn("refused", ui.key.value ? "Key refused" : "Key needed");
  ui.keyStatus.textContent = message;
  ui.keyStatus.classList.add("bad");
  showNotice(message);
  ui.sidebar.prepend(ui.keyForm); // the key first while it is needed
  ui.key.focus();
}

function retryLater() {
  clearTimeout(state.retryTimer);
  state.retryTimer = setTimeout(connect, RETRY_MS);
}

function dropSocket() {
  if (state.ws) {
    const ws = state.ws;
    state.ws = null;
    ws.onopen = ws.onclose = ws.onerror = ws.onmessage = null;
    ws.close();
  }
  state.opened = false;
  state.statsPending = false;
}

function openSocket() {
  const key = ui.key.value;
  const protocols = ["inferd.v1"];
  if (key) protocols.push("inferd.key." + base64url(key));
  let ws;
  try {
    ws = new WebSocket(wsUrl(), protocols);
  } catch (e) {
    setConn("offline", "Cannot connect");
    showNotice("Cannot open the WebSocket: " + e.message);
    return;
  }
  state.ws = ws;
  state.opened = false;
  ws.onopen = () => {
    state.opened = true;
    state.statsPending = false;
    setConn("online", "Connected");
    showNotice("");
    ui.keyStatus.classList.remove("bad");
    ui.keyStatus.textContent = key ? "Key accepted." : "No key sent.";
    send({ type: "plugins", id: "plugins" });
    scheduleStats(0);
  };
  ws.onmessage = (ev) => {
    let frame;
    try { frame = JSON.parse(ev.data); } catch (e) { return; }
    onFrame(frame);
  };
  ws.onclose = () => {
    const wasOpen = state.opened;
    state.ws = null;
    state.opened = false;
    failActive("connection", "the connection closed before the answer ended");
    if (!wasOpen) {
      // The browser does not tell why a handshake failed; the probe just passed, so the
      // key (sent only here, as a subprotocol) is the likely cause.
      refuse("connection refused: check the API key");
      return;
    }
    setConn("offline", "Disconnected");
    showNotice("The connection closed; reconnecting…");
    retryLater();
  };
}

function send(frame) {
  if (!state.ws || !state.opened) return false;
  state.ws.send(typeof frame === "string" ? frame : JSON.stringify(frame));
  return true;
}

// ---------- frames ----------

function onFrame(f) {
  switch (f.type) {
    case "stats": state.statsPending = false; renderStats(f); return;
    case "plugins": renderPlugins(f.plugins || []); return;
  }
  const a = state.active;
  if (f.id && typeof f.id === "string" && f.id.startsWith("s") && f.type === "error") {
    state.statsPending = false; // a stats request refused (overloaded): try again later
    return;
  }
  if (!a || f.id !== a.id) {
    if (f.type === "error") showNotice(f.error.type + ": " + f.error.message);
    return;
  }
  if (f.index) return; // only one choice is asked for
  switch (f.type) {
    case "started":
      a.started = f;
      a.el.dataset.state = "streaming";
      setMetric(a, "m-cached", f.cached_tokens + " of " + f.prompt_tokens);
      break;
    case "delta":
      if (f.text) {
        a.text += f.text;
        a.el.querySelector(".answer-text").textContent = a.text;
      }
      if (f.reasoning) {
        a.reasoning += f.reasoning;
        const box = a.el.querySelector(".reasoning");
        box.hidden = false;
        box.querySelector(".reasoning-text").textContent = a.reasoning;
      }
      scrollDown();
      break;
    case "done":
      finish(a, f);
      break;
    case "error":
      failActive(f.error.type, f.error.message);
      break;
  }
}

function finish(a, f) {
  const u = f.usage || {}, t = f.timings || {};
  setMetric(a, "m-ttft", t.ttft_ms != null ? Math.round(t.ttft_ms) + " ms" : "–");
  setMetric(a, "m-speed", t.decode_tokens_per_s ? t.decode_tokens_per_s.toFixed(1) + " tok/s" : "–");
  setMetric(a, "m-cached", u.cached_tokens + " of " + u.prompt_tokens);
  setMetric(a, "m-tokens", String(u.completion_tokens));
  setMetric(a, "m-finish", f.finish_reason);
  a.el.querySelector(".m-finish").dataset.reason = f.finish_reason;
  a.el.dataset.state = "done";
  a.el.dataset.finish = f.finish_reason;
  // A stopped answer stays in the history as far as it got: the model sees what the
  // transcript shows. (inferd-cli instead drops a cancelled turn: a terminal cannot
  // take the printed text back.)
  state.history.push({ role: "user", content: a.userContent }, { role: "assistant", content: a.text });
  endActive();
}

/** Ends the active answer with an error shown next to it; the turn leaves the history. */
function failActive(tag, message) {
  const a = state.active;
  if (!a) return;
  const box = a.el.querySelector(".answer-error");
  box.querySelector(".error-tag").textContent = tag;
  box.querySelector(".error-message").textContent = message;
  box.hidden = false;
  a.el.dataset.state = "error";
  for (const m of ["m-ttft", "m-speed", "m-cached", "m-tokens"]) {
    if (a.el.querySelector("." + m).textContent === "…") setMetric(a, m, "–");
  }
  const reason = tag === "cancelled" ? "cancelled" : "error"; // stopped before it started
  setMetric(a, "m-finish", reason);
  a.el.querySelector(".m-finish").dataset.reason = reason;
  if (!ui.prompt.value) ui.prompt.value = a.userText; // to fix the setting and resend
  if (!state.images.length) setImages(a.images);
  endActive();
}

function endActive() {
  state.active.el.removeAttribute("aria-busy");
  state.active = null;
  refreshModels();
  ui.stop.disabled = true;
  ui.stop.textContent = "Stop";
  ui.send.disabled = false;
  ui.newChat.disabled = false;
  scheduleStats(0);
  scrollDown();
}

function setMetric(a, cls, text) {
  a.el.querySelector("." + cls).textContent = text;
}

// ---------- sending ----------

const NUMBER_FIELDS = ["temperature", "top_p", "top_k", "max_tokens", "min_tokens", "seed"];
const JSON_NUMBER = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?$/;

/** A number field's JSON: the number exactly as typed (so a seed up to 2^64-1 keeps every
 * digit); text that is no number goes as a string for the server to refuse with its own
 * message. */
function numberJson(text) {
  if (JSON_NUMBER.test(text)) return text;
  if (text !== "" && Number.isFinite(Number(text))) return JSON.stringify(Number(text));
  return JSON.stringify(text);
}

/** The settings as JSON members `"name":value` (numbers as {@link numberJson}); the
 * chosen LoRA adapter as `"adapter"` with its `"lora_scale"` when one is typed. Throws on
 * a plugin config that is not JSON. */
function settingsMembers() {
  const members = [];
  for (const name of NUMBER_FIELDS) {
    const text = $(name).value.trim();
    if (!text) continue;
    members.push(JSON.stringify(name) + ":" + numberJson(text));
  }
  const adapter = ui.modelPick.value;
  if (adapter) {
    members.push('"adapter":' + JSON.stringify(adapter));
    const scale = ui.loraScale.value.trim();
    if (scale) members.push('"lora_scale":' + numberJson(scale));
  }
  const stops = $("stop-strings").value.split("\n").filter((s) => s !== "")
    .map((s) => s.replace(/\\n/g, "\n").replace(/\\t/g, "\t"));
  if (stops.length) members.push('"stop":' + JSON.stringify(stops));
  const plugins = [];
  for (const li of ui.pluginList.children) {
    if (!li.querySelector("input[type=checkbox]").checked) continue;
    const cfgInput = li.querySelector("input[type=text]");
    const cfgText = cfgInput.value.trim();
    let config = {};
    if (cfgText) {
      try { config = JSON.parse(cfgText); } catch (e) {
        cfgInput.setAttribute("aria-invalid", "true");
        cfgInput.focus();
        throw new Error("the config of plugin " + li.dataset.name + " is not JSON: " + e.message);
      }
    }
    cfgInput.removeAttribute("aria-invalid");
    plugins.push({ name: li.dataset.name, config });
  }
  if (plugins.length) members.push('"plugins":' + JSON.stringify(plugins));
  return members;
}

function submit() {
  const text = ui.prompt.value.trim();
  if (!text || state.active) return;
  if (!state.opened) {
    showNotice(state.refused ? ui.keyStatus.textContent : "Not connected yet; retrying…");
    if (!state.refused) connect();
    return;
  }
  let members;
  try { members = settingsMembers(); } catch (e) { showNotice(e.message); return; }
  const id = "g" + (++state.seq);
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  const images = state.images;
  const content = images.length
    ? [{ type: "text", text }, ...images.map((i) => ({ type: "image_url", image_url: { url: i.url } }))]
    : text;
  messages.push(...state.history, { role: "user", content });
  const head = JSON.stringify({ type: "generate", id, messages });
  const frame = head.slice(0, -1) + members.map((m) => "," + m).join("") + "}";

  showNotice("");
  ui.empty.hidden = true;
  const user = $("tpl-user").content.firstElementChild.cloneNode(true);
  user.querySelector(".msg-text").textContent =
    text + images.map((i) => "\n[image: " + i.name + "]").join("");
  const el = $("tpl-answer").content.firstElementChild.cloneNode(true);
  el.dataset.id = id;
  if (ui.modelPick.value) {
    const scale = ui.loraScale.value.trim();
    el.querySelector(".m-adapter").textContent = ui.modelPick.value + (scale ? " × " + scale : "");
    el.querySelector(".m-adapter-row").hidden = false;
  }
  el.setAttribute("aria-busy", "true");
  ui.transcript.append(user, el);
  state.active = { id, userText: text, userContent: content, images, el, text: "", reasoning: "", started: null };
  if (!send(frame)) { failActive("connection", "not connected"); return; }
  ui.prompt.value = "";
  setImages([]);
  ui.send.disabled = true;
  ui.stop.disabled = false;
  ui.newChat.disabled = true;
  scrollDown(true);
  scheduleStats(STATS_BUSY_MS);
}

function stop() {
  const a = state.active;
  if (!a || ui.stop.disabled) return;
  send({ type: "cancel", id: a.id });
  ui.stop.disabled = true;
  ui.stop.textContent = "Stopping…";
}

function newChat() {
  if (state.active) return;
  state.history = [];
  for (const m of [...ui.transcript.querySelectorAll(".msg")]) m.remove();
  ui.empty.hidden = false;
  ui.prompt.focus();
}

// ---------- stats and plugins ----------

/** Polls `stats` after `delay` ms, then every STATS_BUSY_MS while an answer streams and
 * every STATS_IDLE_MS otherwise (one request in flight at most). */
function scheduleStats(delay) {
  clearTimeout(state.statsTimer);
  state.statsTimer = setTimeout(() => {
    if (!state.opened) return;
    if (!state.statsPending) state.statsPending = send({ type: "stats", id: "s" + Date.now() });
    scheduleStats(state.active ? STATS_BUSY_MS : STATS_IDLE_MS);
  }, delay);
}

function renderStats(s) {
  $("stat-running").textContent = s.running;
  $("stat-waiting").textContent = s.waiting;
  $("stat-tokens").textContent = s.tokens_generated;
  const pc = s.prefix_cache;
  $("stat-hits").textContent = pc && pc.enabled ? Math.round(pc.hit_rate * 100) + " %" : "off";
  $("stat-kv").textContent = s.kv_blocks_used + " / " + s.kv_blocks_total;
  const meter = $("kv-meter");
  meter.max = Math.max(1, s.kv_blocks_total);
  meter.value = s.kv_blocks_used;
  $("live-age").textContent = "updated " + new Date().toLocaleTimeString();
}

function renderPlugins(list) {
  ui.pluginList.textContent = "";
  ui.pluginsEmpty.textContent = "No plugins loaded.";
  ui.pluginsEmpty.hidden = list.length > 0;
  // A sampler must come last in a request: list the logits processors first.
  const sorted = [...list].sort((a, b) =>
    (a.world === "sampler") - (b.world === "sampler") || a.name.localeCompare(b.name));
  sorted.forEach((p, i) => {
    const li = document.createElement("li");
    li.dataset.name = p.name;
    const row = document.createElement("div");
    row.className = "check";
    const box = document.createElement("input");
    box.type = "checkbox";
    box.id = "plugin-" + i;
    const label = document.createElement("label");
    label.htmlFor = box.id;
    label.textContent = p.name;
    const world = document.createElement("span");
    world.className = "tag";
    world.textContent = p.world;
    label.append(" ", world);
    row.append(box, label);
    const desc = document.createElement("p");
    desc.className = "hint";
    desc.id = "plugin-desc-" + i;
    desc.textContent = p.description || "";
    const cfgLabel = document.createElement("label");
    cfgLabel.htmlFor = "plugin-config-" + i;
    cfgLabel.className = "visually-hidden";
    cfgLabel.textContent = p.name + " config (JSON)";
    const cfg = document.createElement("input");
    cfg.type = "text";
    cfg.id = "plugin-config-" + i;
    cfg.placeholder = "config JSON, e.g. {}";
    cfg.autocomplete = "off";
    cfg.spellcheck = false;
    cfg.disabled = true;
    cfg.setAttribute("aria-describedby", desc.id);
    box.addEventListener("change", () => { cfg.disabled = !box.checked; });
    li.append(row, desc, cfgLabel, cfg);
    ui.pluginList.append(li);
  });
}

// ---------- page ----------

function scrollDown(force) {
  const t = ui.transcript;
  if (force || t.scrollHeight - t.scrollTop - t.clientHeight < 120) t.scrollTop = t.scrollHeight;
}

// ---------- attached images ----------

/** Shows `images` as removable chips under the message box; they go with the next message. */
function setImages(images) {
  state.images = images;
  ui.attachments.replaceChildren(...images.map((img, i) => {
    const chip = document.createElement("span");
    chip.className = "attachment";
    chip.textContent = img.name;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "×";
    remove.setAttribute("aria-label", "Remove " + img.name);
    remove.addEventListener("click", () => setImages(state.images.filter((_, j) => j !== i)));
    chip.append(remove);
    return chip;
  }));
  ui.attachments.hidden = images.length === 0;
}

/** Reads the chosen files as data: URLs (the daemon never fetches a URL). */
function attachFiles(files) {
  const reads = [...files].map((f) => new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve({ name: f.name, url: r.result });
    r.onerror = () => reject(new Error("cannot read " + f.name));
    r.readAsDataURL(f);
  }));
  Promise.all(reads)
    .then((read) => setImages([...state.images, ...read]))
    .catch((e) => showNotice(e.message))
    .finally(() => { ui.attach.value = ""; });
}

ui.attach.addEventListener("change", () => attachFiles(ui.attach.files));
ui.composer.addEventListener("submit", (e) => { e.preventDefault(); submit(); });
ui.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
});
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && state.active) { e.preventDefault(); stop(); }
});
ui.stop.addEventListener("click", stop);
ui.modelPick.addEventListener("change", syncScale);
ui.newChat.addEventListener("click", newChat);
ui.keyForm.addEventListener("submit", (e) => {
  e.preventDefault();
  saveKey();
  ui.keyStatus.classList.remove("bad");
  ui.keyStatus.textContent = "";
  connect();
});
ui.remember.addEventListener("change", saveKey);

function saveKey() {
  try {
    if (ui.remember.checked && ui.key.value) sessionStorage.setItem(KEY_STORE, ui.key.value);
    else sessionStorage.removeItem(KEY_STORE);
  } catch (e) { /* storage may be off */ }
}

try {
  const saved = sessionStorage.getItem(KEY_STORE);
  if (saved) { ui.key.value = saved; ui.remember.checked = true; }
} catch (e) { /* storage may be off */ }
ui.prompt.focus();
connect();
