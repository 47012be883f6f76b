/* What clairvoyant's two read-only FUSE daemons share (testing/emufs.c, mount/mountfs.c).
 *
 * - Every change fails with EROFS: CV_READONLY_OPS fills those members of a
 *   struct fuse_operations.
 * - cv_take_source: a fuse_opt_proc that takes the first argument that is not an
 *   option as the source directory (cv_source); the rest (the mount point) go on.
 * - cv_watch_parent: a thread that sends this process SIGTERM (fuse_main then
 *   leaves its loop and unmounts) once the process that started it (cv_parent,
 *   set before the thread starts) is gone.
 */
#ifndef CLAIRVOYANT_FUSE_COMMON_H
#define CLAIRVOYANT_FUSE_COMMON_H

#include <errno.h>
#include <stddef.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static char *cv_source = NULL;
static pid_t cv_parent = 0;

static int ro_path(const char *p) { (void)p; return -EROFS; }
static int ro_path_mode(const char *p, mode_t m) { (void)p; (void)m; return -EROFS; }
static int ro_mknod(const char *p, mode_t m, dev_t d) { (void)p; (void)m; (void)d; return -EROFS; }
static int ro_two(const char *a, const char *b) { (void)a; (void)b; return -EROFS; }
static int ro_rename(const char *a, const char *b, unsigned int f) { (void)a; (void)b; (void)f; return -EROFS; }
static int ro_chmod(const char *p, mode_t m, struct fuse_file_info *fi) { (void)p; (void)m; (void)fi; return -EROFS; }
static int ro_chown(const char *p, uid_t u, gid_t g, struct fuse_file_info *fi) {
    (void)p; (void)u; (void)g; (void)fi; return -EROFS;
}
static int ro_truncate(const char *p, off_t s, struct fuse_file_info *fi) { (void)p; (void)s; (void)fi; return -EROFS; }
static int ro_write(const char *p, const char *b, size_t n, off_t o, struct fuse_file_info *fi) {
    (void)p; (void)b; (void)n; (void)o; (void)fi; return -EROFS;
}
static int ro_create(const char *p, mode_t m, struct fuse_file_info *fi) { (void)p; (void)m; (void)fi; return -EROFS; }
static int ro_utimens(const char *p, const struct timespec tv[2], struct fuse_file_info *fi) {
    (void)p; (void)tv; (void)fi; return -EROFS;
}
static int ro_setxattr(const char *p, const char *n, const char *v, size_t s, int f) {
    (void)p; (void)n; (void)v; (void)s; (void)f; return -EROFS;
}
static int ro_removexattr(const char *p, const char *n) { (void)p; (void)n; return -EROFS; }
static int ro_fallocate(const char *p, int m, off_t o, off_t n, struct fuse_file_info *fi) {
    (void)p; (void)m; (void)o; (void)n; (void)fi; return -EROFS;
}

/* A fuse_opt entry for member f of the daemon's option struct ``opt``. */
#define OPT(t, f, v) {t, offsetof(__typeof__(opt), f), v}

#define CV_READONLY_OPS \
    .mknod = ro_mknod, .mkdir = ro_path_mode, .unlink = ro_path, .rmdir = ro_path, .symlink = ro_two, \
    .link = ro_two, .rename = ro_rename, .chmod = ro_chmod, .chown = ro_chown, .truncate = ro_truncate, \
    .write = ro_write, .create = ro_create, .utimens = ro_utimens, .setxattr = ro_setxattr, \
    .removexattr = ro_removexattr, .fallocate = ro_fallocate

static int cv_take_source(void *data, const char *arg, int key, struct fuse_args *args) {
    (void)data; (void)args;
    if (key == FUSE_OPT_KEY_NONOPT && !cv_source) {
        cv_source = strdup(arg);
        return 0;
    }
    return 1;
}

static void *cv_watch_parent(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);  /* SIGTERM must reach fuse_main's handler */
    while (getppid() == cv_parent) usleep(100000);
    kill(getpid(), SIGTERM);
    return NULL;
}

#endif
