/* Carries a few bytes (NCCL's 128-byte unique id) from rank 0 to every other
 * rank through the channel launch.c chose, without MPI and without CUDA:
 *   CP_ID_FILE      rank 0 writes COMMPLAN_ID_FILE (temporary name, then
 *                   rename); the others poll for it. The file names the job
 *                   and the key, so another job's or plan's file is never
 *                   read; once every rank holds the id rank 0 removes it
 *                   (cp_rendezvous_release), so a second run of the binary
 *                   in the same job never reads the first run's id.
 *   CP_ID_TCPSTORE  a client of torchrun's agent store (PyTorch's TCPStore
 *                   wire protocol) at MASTER_ADDR:MASTER_PORT: every rank
 *                   ADDs to "commplan/<run id>/<restart>/launches" (which
 *                   run of the binary in this launch it is: a second run
 *                   never reads the first's id) and SETs its plan's
 *                   fingerprint and name as .../launch<k>/hello/<rank>;
 *                   rank 0 compares them, SETs .../nccl_id and a verdict
 *                   ("ok", or the one line every rank then prints: a rank
 *                   built from another plan is refused on every rank); the
 *                   others WAIT for the verdict and GET the id.
 *   CP_ID_NCCL_COMM_ID, CP_ID_MASTER_ADDR, CP_ID_ALONE: nothing travels;
 *                   every rank derives the id itself (NCCL_COMM_ID). */
#ifndef COMMPLAN_RENDEZVOUS_H
#define COMMPLAN_RENDEZVOUS_H

#include <stddef.h>

#include "launch.h"

enum {
    CP_RDZV_ERROR = -1,    /* err holds one line: channel, variable, rank, fix */
    CP_RDZV_SHARED = 0,    /* bytes now hold rank 0's bytes on every rank */
    CP_RDZV_NCCL_OWN = 1,  /* this channel shares nothing: every rank calls ncclGetUniqueId with NCCL_COMM_ID */
};

/* Rank 0 has filled bytes[0..len) and publishes them; every other rank
 * receives them into bytes. key_suffix (the plan fingerprint) keeps two
 * plans from reading each other's bytes; printable, no spaces. timeout_s <= 0
 * means env->init_timeout_s. Waits at most timeout_s, never forever. */
int cp_rendezvous_share(const cp_launch_env *env, const char *key_suffix, void *bytes, size_t len, double timeout_s,
                        char *err, size_t errlen);

typedef struct {
    long long launch; /* torchrun's store: which run of the binary in this launch (0, 1, ...); else 0 */
} cp_rendezvous_info;

/* The same, naming the plan (printable, no spaces, at most 128 bytes; NULL:
 * unnamed) so that a refusal says which plan each side runs; info, when not
 * NULL, gets where the rendezvous took place. */
int cp_rendezvous_share_plan(const cp_launch_env *env, const char *plan_name, const char *key_suffix, void *bytes,
                             size_t len, double timeout_s, cp_rendezvous_info *info, char *err, size_t errlen);

/* COMMPLAN_ID_FILE only (0 and nothing done on the other channels and on
 * ranks other than 0): removes this job's id file once every rank holds the
 * id, if it still holds these bytes, so that a later run of the binary in
 * the same job (same job tag, same path) waits for its own rank 0 instead of
 * reading this run's dead id. Call it on rank 0 after ncclCommInitRank:
 * NCCL's root answers no rank before every rank has connected with the id,
 * and no other rank gets through its init before rank 0 has. A file left by
 * a run whose rank 0 died before this point can still be read by the next
 * run; NCCL then fails to connect to that dead root (an error, never another
 * run's communicator). 0, or -1 with one line in err. */
int cp_rendezvous_release(const cp_launch_env *env, const char *key_suffix, const void *bytes, size_t len, char *err,
                          size_t errlen);

/* The same where no NCCL init follows (--rendezvous-only): a barrier over
 * the id file's directory. Ranks 1..n-1 write <file>.ack<rank> naming the id
 * (a hash) and wait until rank 0 has removed the id file; rank 0 waits for
 * every acknowledgement of this id, removes them and the id file. Bounded
 * by timeout_s (<= 0: env->init_timeout_s). A no-op on other channels (the
 * torchrun store counts launches instead). 0, or -1 with one line in err. */
int cp_rendezvous_confirm(const cp_launch_env *env, const char *key_suffix, const void *bytes, size_t len,
                          double timeout_s, char *err, size_t errlen);

#endif
