/*
 * dsrt core: version, error codes and error messages shared by every module.
 *
 * Every fallible dsrt call returns an int: 0 on success or a negative code.
 * Failures of the operating system are reported as -errno (for example
 * -ENOENT); failures that belong to dsrt use the DSRT_E* codes below, which
 * lie far below any errno value. dsrt_strerror() names either kind.
 *
 * Besides the code, a failing call leaves a message with context on the
 * calling thread ("decode: /data/cat/17.jpg: Premature end of JPEG file"),
 * read with dsrt_last_error(). The message belongs to the thread, so threads
 * never see each other's errors. Both functions are thread-safe.
 */
#ifndef DSRT_CORE_H
#define DSRT_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(DSRT_SHARED_BUILD)
#define DSRT_API __attribute__((visibility("default")))
#else
#define DSRT_API
#endif

#define DSRT_VERSION_MAJOR 0
#define DSRT_VERSION_MINOR 1
#define DSRT_VERSION_PATCH 0
#define DSRT_VERSION_NUMBER                                                                        \
    (DSRT_VERSION_MAJOR * 10000 + DSRT_VERSION_MINOR * 100 + DSRT_VERSION_PATCH)

/* The version of the library linked at run time, as DSRT_VERSION_NUMBER. */
DSRT_API unsigned dsrt_version(void);
/* The same as "major.minor.patch". */
DSRT_API const char *dsrt_version_string(void);

/* dsrt's own error codes: name, value, description. */
#define DSRT_ERRNO_MAP(XX)                                                                         \
    XX(EFORMAT, -1001, "unrecognised file format")                                                 \
    XX(ECORRUPT, -1002, "corrupt data")                                                            \
    XX(ETRUNCATED, -1003, "truncated data")                                                        \
    XX(ETOOBIG, -1004, "larger than the configured limit")                                         \
    XX(EEMPTY, -1005, "empty")                                                                     \
    XX(EUNSUPPORTED, -1006, "unsupported feature")                                                 \
    XX(EOPTION, -1007, "invalid option")                                                           \
    XX(EEOF, -1008, "end of data")                                                                 \
    XX(ECHECKSUM, -1009, "checksum mismatch")                                                      \
    XX(ENAN, -1010, "non-finite value")                                                            \
    XX(EBACKEND, -1011, "compute backend failure")                                                 \
    XX(ENODEVICE, -1012, "no such device")                                                         \
    XX(ECLOSED, -1013, "handle closed")                                                            \
    XX(ESKIPPED, -1014, "too many samples skipped")                                                \
    XX(EMODULE, -1015, "a module or a library it needs cannot be loaded")                          \
    XX(EREMOTE, -1016, "object store failure")

enum {
#define DSRT_ERRNO_ENUM(name, value, text) DSRT_##name = value,
    DSRT_ERRNO_MAP(DSRT_ERRNO_ENUM)
#undef DSRT_ERRNO_ENUM
};

/*
 * A short description of an error code: a DSRT_E* code, or -errno.
 * Never returns NULL; the string is static.
 */
DSRT_API const char *dsrt_strerror(int code);

/*
 * The message of the last failing dsrt call on this thread, with context
 * (file names, option names, values). "" when none failed yet. The string
 * stays valid until the next failing dsrt call on the same thread.
 */
DSRT_API const char *dsrt_last_error(void);

/* What the module loader warned of while loading dsrt's modules (the GPU
 * backend, the communicators): one line each, for example a module found in
 * a folder every user may write to, or through a relative folder of
 * DSRT_MODULE_PATH; "" when nothing. The library never prints: programs
 * show these. Thread-safe; the text belongs to the calling thread and stays
 * valid until its next call. */
DSRT_API const char *dsrt_module_warnings(void);

/*
 * Copies text (a URL, or a message that may hold URLs or an answer of a
 * server) into out, cap bytes NUL-terminated (cut short when it does not
 * fit), with what could let someone in masked as "***": the user
 * information of URLs (the "user:pass@" of "https://user:pass@host/x"
 * becomes "***@") and the values of the parameters and headers that
 * carry keys, signatures and tokens (X-Amz-Signature, X-Amz-Credential,
 * X-Amz-Security-Token, Signature, Credential, AWSAccessKeyId,
 * Authorization, ... written "name=value" or "name: value", in any case).
 * Every message of dsrt_last_error() has been through it; programs use it
 * where they show a path or URL of their own. text and out must not
 * overlap. Thread-safe.
 */
DSRT_API void dsrt_text_redact(const char *text, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
