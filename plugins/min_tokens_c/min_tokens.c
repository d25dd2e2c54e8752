// `min_tokens`: a logits processor written in C. While fewer than N tokens have been
// generated it bans every end-of-generation token (from the host's special tokens), so
// the answer is at least N tokens long; then it keeps the logits unchanged.
//
// Config: `{"min_tokens": N}`, an integer from 1 to 1000000 (required).
//
// Bindings: `wit-bindgen c` generates `logits_processor_plugin.{h,c}` from the WIT
// package; see scripts/build-plugins.sh. Ownership follows the generated code: the
// arguments of an export belong to this code (freed here), and what it returns is freed
// by the generated post-return functions (so it must come from malloc).
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "logits_processor_plugin.h"

// Minimum number of generated tokens, set by `configure`.
static uint32_t min_tokens;
// The end-of-generation token ids, from the host in `configure`.
static logits_processor_plugin_list_u32_t end_of_generation;

void exports_inferd_plugin_logits_processor_info(
    exports_inferd_plugin_logits_processor_plugin_info_t *ret) {
    logits_processor_plugin_string_dup(&ret->name, "min_tokens");
    logits_processor_plugin_string_dup(&ret->version, "0.1.0");
    logits_processor_plugin_string_dup(
        &ret->description, "Bans end-of-generation tokens until N tokens are generated");
}

bool exports_inferd_plugin_logits_processor_configure(logits_processor_plugin_string_t *config,
                                                      uint64_t seed,
                                                      logits_processor_plugin_string_t *err) {
    (void)seed;
    char message[CONFIG_ERROR_CAP];
    int ok = parse_min_tokens_config(config->ptr, config->len, &min_tokens, message);
    logits_processor_plugin_string_free(config);
    if (!ok) {
        logits_processor_plugin_string_dup(err, message);
        return false;
    }
    inferd_plugin_types_special_token_ids_t special;
    inferd_plugin_host_special_tokens(&special);
    logits_processor_plugin_list_u32_free(&end_of_generation);
    end_of_generation = special.end_of_generation; // keep this list, free the rest
    logits_processor_plugin_list_u32_free(&special.control);
    return true;
}

bool exports_inferd_plugin_logits_processor_process(
    exports_inferd_plugin_logits_processor_step_context_t *ctx,
    logits_processor_plugin_list_f32_t *logits,
    exports_inferd_plugin_logits_processor_logits_edit_t *ret,
    logits_processor_plugin_string_t *err) {
    (void)err;
    size_t generated = ctx->generated.len;
    exports_inferd_plugin_logits_processor_step_context_free(ctx);
    logits_processor_plugin_list_f32_free(logits);
    size_t n = end_of_generation.len;
    if (generated >= min_tokens || n == 0) {
        ret->tag = INFERD_PLUGIN_TYPES_LOGITS_EDIT_KEEP;
        return true;
    }
    uint32_t *ids = malloc(n * sizeof *ids);
    if (ids == NULL) {
        abort();
    }
    memcpy(ids, end_of_generation.ptr, n * sizeof *ids);
    ret->tag = INFERD_PLUGIN_TYPES_LOGITS_EDIT_BAN;
    ret->val.ban.ptr = ids;
    ret->val.ban.len = n;
    return true;
}
