// Dumps llama.cpp's intermediate tensors for one prompt, for op-by-op comparison with
// inferd (scripts/llamacpp-dump.sh builds and runs it; daemon/src/model/trace_tests.rs
// reads the dump).
//
//   llamacpp-dump MODEL.gguf OUT.bin TOKEN_ID...
//
// The prompt is decoded as one batch (as llama-server prefills it), then the last
// token's argmax is decoded as a second, single-token batch. Every f32 graph tensor is
// written as it is computed (the scheduler's eval callback): u32 name length, name,
// u32 step (0 prefill, 1 decode), 4 × i64 ne, ne0·ne1·ne2·ne3 f32 values (contiguous
// copies). Settings are llama-server's defaults for `-t 2 -np 1 -c 4096`.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

struct Dump {
    FILE * f;
    uint32_t step;
};

static bool on_tensor(struct ggml_tensor * t, bool ask, void * user) {
    if (ask) {
        return true;  // observe every node
    }
    auto * d = (Dump *) user;
    if (t->type != GGML_TYPE_F32) {
        return true;
    }
    const int64_t n = ggml_nelements(t);
    std::vector<float> v(n);
    if (ggml_is_contiguous(t)) {
        ggml_backend_tensor_get(t, v.data(), 0, n * sizeof(float));
    } else {
        // Gather a strided view element by element.
        std::vector<uint8_t> raw(ggml_nbytes(t));
        ggml_backend_tensor_get(t, raw.data(), 0, raw.size());
        int64_t i = 0;
        for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
            for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
                for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                    for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                        size_t off = i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                        memcpy(&v[i++], raw.data() + off, sizeof(float));
                    }
    }
    const std::string name = t->name;
    const uint32_t len = name.size();
    fwrite(&len, 4, 1, d->f);
    fwrite(name.data(), 1, len, d->f);
    fwrite(&d->step, 4, 1, d->f);
    for (int k = 0; k < 4; k++) {
        int64_t ne = t->ne[k];
        fwrite(&ne, 8, 1, d->f);
    }
    fwrite(v.data(), 4, n, d->f);
    return true;
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf OUT.bin TOKEN_ID...\n", argv[0]);
        return 2;
    }
    std::vector<llama_token> prompt;
    for (int i = 3; i < argc; i++) {
        prompt.push_back((llama_token) atoi(argv[i]));
    }
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    Dump d{fopen(argv[2], "wb"), 0};
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 4096;
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
    cp.cb_eval = on_tensor;
    cp.cb_eval_user_data = &d;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    if (llama_decode(ctx, llama_batch_get_one(prompt.data(), (int32_t) prompt.size())) != 0) {
        fprintf(stderr, "prefill failed\n");
        return 1;
    }
    const float * logits = llama_get_logits_ith(ctx, -1);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_token best = 0;
    for (int i = 1; i < n_vocab; i++) {
        if (logits[i] > logits[best]) best = i;
    }
    printf("prefill argmax %d\n", best);
    d.step = 1;
    if (llama_decode(ctx, llama_batch_get_one(&best, 1)) != 0) {
        fprintf(stderr, "decode failed\n");
        return 1;
    }
    fclose(d.f);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
