/* libfuse3, loaded at run time: clairvoyant's FUSE daemons (testing/emufs.c, mount/mountfs.c)
 * link nothing but glibc.
 *
 * They are compiled at install time (setup.py) with libfuse3's headers, for struct
 * fuse_operations and the other types, and linked without the library: main() first calls
 * cv_load_libfuse(), which dlopen()s "libfuse3.so.3" (or $CLAIRVOYANT_LIBFUSE, a path or a
 * soname) and resolves the few functions the daemons call; the macros at the end send the
 * daemons' calls of those functions there. A libfuse function the daemons start to call without
 * adding it here fails the link (nothing links -lfuse3), so nothing can slip back to a link.
 * So a daemon built once runs on a node with FUSE 3's shared library (Debian/Ubuntu: fuse3,
 * which brings libfuse3-3) and neither headers nor a compiler.
 *
 * Without the library, the daemon says so on stderr, naming it, what to install and the
 * variable, and exits with CV_EXIT_NO_LIBFUSE. `DAEMON --check-libfuse` only loads it (exit 0
 * when it did): clairvoyant.fuse.daemon asks that before mounting and surfaces the message.
 *
 * The functions are looked up at symbol version FUSE_3.0, the ABI every program linked with a
 * libfuse 3 is bound to and which later releases of libfuse3.so.3 keep for them (3.17 added
 * newer versions of fuse_main_real beside it), else by plain name (a library built without
 * symbol versions). fuse_main_real takes the size of struct fuse_operations, which only grows
 * within libfuse 3, so a daemon built with older headers runs with a newer library.
 */
#ifndef CLAIRVOYANT_FUSE_LOADER_H
#define CLAIRVOYANT_FUSE_LOADER_H

#ifndef FUSE_USE_VERSION
#error "include <fuse.h> before fuse_loader.h"
#endif

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CV_LIBFUSE_ENV "CLAIRVOYANT_LIBFUSE"
#define CV_LIBFUSE_SONAME "libfuse3.so.3"
#define CV_EXIT_NO_LIBFUSE 78   /* sysexits' EX_CONFIG */

static struct {
    int (*opt_parse)(struct fuse_args *, void *, const struct fuse_opt *, fuse_opt_proc_t);
    int (*opt_add_arg)(struct fuse_args *, const char *);
    void (*opt_free_args)(struct fuse_args *);
    int (*main_real)(int, char **, const struct fuse_operations *, size_t, void *);
} cv_fuse;

static void *cv_fuse_symbol(void *lib, const char *name) {
    void *p = dlvsym(lib, name, "FUSE_3.0");
    return p ? p : dlsym(lib, name);
}

/* Load libfuse3 and resolve what the daemons call; on failure say why on stderr (as ``prog``)
 * and return CV_EXIT_NO_LIBFUSE, else 0. */
static int cv_load_libfuse(const char *prog) {
    const char *chosen = getenv(CV_LIBFUSE_ENV);
    const char *name = chosen && *chosen ? chosen : CV_LIBFUSE_SONAME;
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        if (chosen && *chosen)
            fprintf(stderr, "%s: cannot load FUSE 3's library from %s=%s (%s): set %s to the path of a "
                            "libfuse3.so.3, or unset it to use the system's (Debian/Ubuntu: apt-get install "
                            "fuse3)\n", prog, CV_LIBFUSE_ENV, chosen, why ? why : "not found", CV_LIBFUSE_ENV);
        else
            fprintf(stderr, "%s: cannot load FUSE 3's library %s (%s): install it (Debian/Ubuntu: apt-get "
                            "install fuse3, which brings libfuse3-3; Fedora/RHEL: dnf install fuse3 fuse3-libs), "
                            "or set %s to the path of a libfuse3.so.3\n",
                    prog, CV_LIBFUSE_SONAME, why ? why : "not found", CV_LIBFUSE_ENV);
        return CV_EXIT_NO_LIBFUSE;
    }
    static const char *const names[] = {"fuse_opt_parse", "fuse_opt_add_arg", "fuse_opt_free_args",
                                        "fuse_main_real"};
    void *found[4];
    for (int i = 0; i < 4; i++) {
        found[i] = cv_fuse_symbol(lib, names[i]);
        if (!found[i]) {
            fprintf(stderr, "%s: %s has no %s: not FUSE 3's library? Install fuse3 (Debian/Ubuntu: apt-get install "
                            "fuse3), or set %s to the path of a libfuse3.so.3\n", prog, name, names[i],
                    CV_LIBFUSE_ENV);
            dlclose(lib);
            return CV_EXIT_NO_LIBFUSE;
        }
    }
    /* the library stays loaded until exit */
    memcpy(&cv_fuse.opt_parse, &found[0], sizeof found[0]);
    memcpy(&cv_fuse.opt_add_arg, &found[1], sizeof found[1]);
    memcpy(&cv_fuse.opt_free_args, &found[2], sizeof found[2]);
    memcpy(&cv_fuse.main_real, &found[3], sizeof found[3]);
    return 0;
}

/* The start of a daemon's main(): load libfuse3 (return its failure), and with --check-libfuse
 * as the only argument, stop there. */
#define CV_LOAD_LIBFUSE_OR_RETURN(prog, argc, argv)                                       \
    do {                                                                                 \
        int cv_rc_ = cv_load_libfuse(prog);                                              \
        if (cv_rc_ || ((argc) == 2 && strcmp((argv)[1], "--check-libfuse") == 0)) return cv_rc_; \
    } while (0)

/* The daemons' calls, as they would be written against the linked library. */
#undef fuse_main
#define fuse_opt_parse(args, data, opts, proc) cv_fuse.opt_parse(args, data, opts, proc)
#define fuse_opt_add_arg(args, arg) cv_fuse.opt_add_arg(args, arg)
#define fuse_opt_free_args(args) cv_fuse.opt_free_args(args)
#define fuse_main(argc, argv, op, private_data) cv_fuse.main_real(argc, argv, op, sizeof(*(op)), private_data)

#endif
