/*
 * Module files for test_module: built three times, as dsrt_fixture.so in
 * three folders. The good one carries this build's note and entry; "other"
 * carries a note of another version and a constructor that leaves a marker
 * file (the loader must refuse it from the note alone, before dlopen could
 * run the constructor); "nonote" has an entry but no note.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/module.h"

static const int fixture_ops = 42;

#if defined(DSRT_VARIANT_OTHER)
DSRT_MODULE_NOTE_SECTION static const dsrt_module_note note = {
    5,
    sizeof(dsrt_module_note) - 20,
    DSRT_MODULE_NOTE_TYPE,
    "dsrt",
    {DSRT_MODULE_ABI, DSRT_VERSION_NUMBER + 1, "fixture"}};

/* What a module of another build might do at load: here, leave a trace. */
__attribute__((constructor)) static void ran_at_load(void) {
    const char *marker = getenv("DSRT_FIXTURE_MARKER");
    if (marker) {
        int fd = open(marker, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) close(fd);
    }
}
#elif !defined(DSRT_VARIANT_NONOTE)
DSRT_MODULE_NOTE(fixture);
#endif

DSRT_MODULE_EXPORT const dsrt_module_entry dsrt_module_fixture = {
    .abi = DSRT_MODULE_ABI,
    .version = DSRT_VERSION_NUMBER,
    .name = "fixture",
    .ops = &fixture_ops,
};
