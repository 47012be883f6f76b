/* experiment: does pushing a file's bytes into the kernel's page cache (notify_store) save the
 * READ round trip's CPU? N files of SIZE bytes; SIGUSR1 pushes all, SIGUSR2 prints daemon CPU. */
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
#include <sys/stat.h>
static int N = 2000, SIZE = 30000;
static char *data;
static struct fuse_session *se;
static volatile int push_req;
static void fill(struct stat *st, fuse_ino_t ino) {
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    if (ino == 1) { st->st_mode = S_IFDIR | 0555; st->st_nlink = 2; }
    else { st->st_mode = S_IFREG | 0444; st->st_nlink = 1; st->st_size = SIZE; }
}
static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    int i;
    if (parent != 1 || sscanf(name, "f%d", &i) != 1 || i < 0 || i >= N) { fuse_reply_err(req, ENOENT); return; }
    struct fuse_entry_param e; memset(&e, 0, sizeof e);
    e.ino = 2 + i; e.attr_timeout = e.entry_timeout = 3600; fill(&e.attr, e.ino);
    fuse_reply_entry(req, &e);
}
static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi; struct stat st; fill(&st, ino); fuse_reply_attr(req, &st, 3600);
}
static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino; (void)fi; fuse_reply_err(req, ENOSYS);
}
static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)fi;
    size_t i = ino - 2;
    if (off >= SIZE) { fuse_reply_buf(req, NULL, 0); return; }
    if (off + size > (size_t)SIZE) size = SIZE - off;
    char *buf = malloc(size);   /* as mountfs: a copy out of the tier first */
    memcpy(buf, data + i * SIZE + off, size);
    fuse_reply_buf(req, buf, size);
    free(buf);
}
static void ll_init(void *ud, struct fuse_conn_info *conn) {
    (void)ud;
    if (conn->capable & FUSE_CAP_NO_OPEN_SUPPORT) conn->want |= FUSE_CAP_NO_OPEN_SUPPORT;
    conn->max_background = 64; conn->congestion_threshold = 64;
}
static const struct fuse_lowlevel_ops ops = { .init = ll_init, .lookup = ll_lookup, .getattr = ll_getattr,
                                              .open = ll_open, .read = ll_read };
static void *pusher(void *a) {
    (void)a;
    for (;;) {
        while (!push_req) usleep(1000);
        push_req = 0;
        struct timespec t0, t1; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        int ok = 0, bad = 0;
        for (int i = 0; i < N; i++) {
            char *buf = malloc(SIZE); memcpy(buf, data + (size_t)i * SIZE, SIZE);   /* read + verify stand-in */
            struct fuse_bufvec bv = FUSE_BUFVEC_INIT(SIZE);
            bv.buf[0].mem = buf;
            int r = fuse_lowlevel_notify_store(se, 2 + i, 0, &bv, 0);
            free(buf);
            if (r == 0) ok++; else bad++;
        }
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
        fprintf(stderr, "pushed %d (failed %d): %.1f us CPU per file\n", ok, bad,
                ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / N);
    }
    return NULL;
}
static void on_usr1(int s) { (void)s; push_req = 1; }
int main(int argc, char **argv) {
    struct fuse_args args = FUSE_ARGS_INIT(argc - 1, argv);
    const char *mnt = argv[argc - 1];
    data = malloc((size_t)N * SIZE);
    for (size_t k = 0; k < (size_t)N * SIZE; k++) data[k] = (char)(k * 131 + 7);
    se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_set_signal_handlers(se) || fuse_session_mount(se, mnt)) return 1;
    signal(SIGUSR1, on_usr1);
    pthread_t t; pthread_create(&t, NULL, pusher, NULL);
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(cfg, 16);
    int r = fuse_session_loop_mt(se, cfg);
    fuse_session_unmount(se); fuse_remove_signal_handlers(se); fuse_session_destroy(se);
    return r;
}
