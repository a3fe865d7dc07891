/* A runtime's sampled stacks (CPython's objects, cpython.h; SBCL's allocation regions,
 * sbcl.h), as one process-wide buffer of records sent as one message kind
 * (docs/trace-format.md, chunks 18 and 22). Each record starts with the ticks since the
 * one before; frames and stacks are defined once by id, ids counting up per process.
 * The tables are forgotten when crowded: ids go on counting up, so the reader keeps the
 * older definitions. Included once, by fragscope_preload.c, after the socket and clock
 * helpers. The caller orders the calls on a log (CPython's GIL, SBCL's lisp_lock). */

#define SAMPLE_BUF_CAP (64 << 10)
#define SAMPLE_FRAME_SLOTS 8192
#define SAMPLE_STACK_SLOTS 4096
enum { SAMPLE_REC_FRAME = 3, SAMPLE_REC_STACK = 4, SAMPLE_REC_UNSAMPLED = 6 };

struct sample_log {
    uint32_t msg_type;
    uint32_t mean_bytes; /* sent in the header's seq: how the reader weighs a sample */
    uint32_t len;
    uint64_t first_tick, last_tick;
    uint32_t next_frame, next_stack;
    /* A frame is named by two words of the caller's choosing. */
    struct { uint64_t a, b; uint32_t id; } frame_slots[SAMPLE_FRAME_SLOTS];
    struct { uint64_t hash; uint32_t id; } stack_slots[SAMPLE_STACK_SLOTS];
    uint8_t buf[SAMPLE_BUF_CAP];
};

static void log_flush(struct sample_log *l) {
    if (!l->len) return;
    struct msg_header h = {l->msg_type, l->len, (uint32_t)syscall(SYS_gettid), l->mean_bytes,
                           l->first_tick, l->last_tick};
    send_message(&h, l->buf, 0);
    l->len = 0;
}

/* Room for `bytes` more, and the record's tick written; NULL when it cannot fit. */
static uint8_t *log_reserve(struct sample_log *l, size_t bytes) {
    uint64_t tick = current_tick();
    if (l->len && (l->len + bytes > SAMPLE_BUF_CAP || tick - l->first_tick >= flush_interval_ticks))
        log_flush(l);
    if (bytes > SAMPLE_BUF_CAP) return NULL;
    if (!l->len) l->first_tick = l->last_tick = tick;
    uint8_t *o = l->buf + l->len;
    o = put_varint(o, tick - l->last_tick);
    l->last_tick = tick;
    return o;
}

/* The record ending at `o` is written. */
static void log_commit(struct sample_log *l, const uint8_t *o) { l->len = (uint32_t)(o - l->buf); }

static uint8_t *put_bytes(uint8_t *o, const char *s, size_t n) {
    o = put_varint(o, n);
    memcpy(o, s, n);
    return o + n;
}

/* Sends why this process's runtime is not sampled (`why`, when not empty) as the log's
 * one record: once at start, and again in a forked child (a process, and a report, of
 * its own). */
static void log_tell_unsampled(struct sample_log *l, uint32_t msg_type, const char *why,
                               size_t cap) {
    size_t n = strnlen(why, cap);
    if (!n) return;
    l->msg_type = msg_type;
    uint8_t *o = log_reserve(l, 16 + n);
    if (!o) return;
    *o++ = SAMPLE_REC_UNSAMPLED;
    o = put_bytes(o, why, n);
    log_commit(l, o);
    log_flush(l);
}

/* The id of frame (a, b), else 0 with `*slot` where a new one goes (log_define_frame). */
static uint32_t log_frame_id(struct sample_log *l, uint64_t a, uint64_t b, uint32_t *slot) {
    uint64_t h = (a * 0x9E3779B97F4A7C15ULL) ^ (b * 0xC2B2AE3D27D4EB4FULL);
    uint32_t first = (uint32_t)(h >> 40) & (SAMPLE_FRAME_SLOTS - 1);
    for (uint32_t probe = 0; probe < 8; probe++) {
        uint32_t s = (first + probe) & (SAMPLE_FRAME_SLOTS - 1);
        if (l->frame_slots[s].id && l->frame_slots[s].a == a && l->frame_slots[s].b == b)
            return l->frame_slots[s].id;
        if (!l->frame_slots[s].id) {
            *slot = s;
            return 0;
        }
    }
    memset(l->frame_slots, 0, sizeof l->frame_slots);
    *slot = first;
    return 0;
}

/* Writes the FRAME record of a new frame (a, b) at `slot`; its id, or 0 when no room. */
static uint32_t log_define_frame(struct sample_log *l, uint32_t slot, uint64_t a, uint64_t b,
                                 uint32_t line, const char *file, size_t file_len,
                                 const char *function, size_t function_len) {
    uint8_t *o = log_reserve(l, 32 + file_len + function_len);
    if (!o) return 0;
    if (!l->next_frame) l->next_frame = 1;
    uint32_t id = l->next_frame++;
    l->frame_slots[slot].a = a;
    l->frame_slots[slot].b = b;
    l->frame_slots[slot].id = id;
    *o++ = SAMPLE_REC_FRAME;
    o = put_varint(o, id);
    o = put_varint(o, line);
    o = put_bytes(o, file, file_len);
    o = put_bytes(o, function, function_len);
    log_commit(l, o);
    return id;
}

/* The id of a stack of frame ids (innermost first), defined at its first use. */
static uint32_t log_stack_id(struct sample_log *l, const uint32_t *ids, int n) {
    uint64_t h = 0x84222325CBF29CE4ULL ^ (uint64_t)n;
    for (int i = 0; i < n; i++) h = stack_hash_step(h, ids[i]);
    if (h == 0) h = 1;
    uint32_t slot = (uint32_t)h & (SAMPLE_STACK_SLOTS - 1);
    for (uint32_t probe = 0; probe < 8; probe++) {
        uint32_t s = (slot + probe) & (SAMPLE_STACK_SLOTS - 1);
        if (l->stack_slots[s].hash == h) return l->stack_slots[s].id;
        if (!l->stack_slots[s].hash) {
            slot = s;
            goto define;
        }
    }
    memset(l->stack_slots, 0, sizeof l->stack_slots);
define:;
    uint8_t *o = log_reserve(l, 16 + (size_t)n * 5);
    if (!o) return 0;
    if (!l->next_stack) l->next_stack = 1;
    uint32_t id = l->next_stack++;
    l->stack_slots[slot].hash = h;
    l->stack_slots[slot].id = id;
    *o++ = SAMPLE_REC_STACK;
    o = put_varint(o, id);
    o = put_varint(o, (uint64_t)n);
    for (int i = 0; i < n; i++) o = put_varint(o, ids[i]);
    log_commit(l, o);
    return id;
}
