/* A fake launcher environment for the C tests: NULL-terminated
 * "name=value" pairs behind cp_launch_from_env's getenv indirection. */
#ifndef COMMPLAN_TEST_FAKE_ENV_H
#define COMMPLAN_TEST_FAKE_ENV_H

#include <string.h>

#include "launch.h"

static const char *const *fake_env;

static char *fake_getenv(const char *name)
{
    size_t n = strlen(name);
    for (const char *const *e = fake_env; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=') return (char *)(*e + n + 1);
    return NULL;
}

static int fake_launch(const char *const *env, cp_launch_env *out, char *err, size_t errlen)
{
    fake_env = env;
    err[0] = '\0';
    return cp_launch_from_env(out, fake_getenv, err, errlen);
}

/* err: a char array in scope. */
#define launch(env, out, err) fake_launch((env), (out), (err), sizeof(err))

#endif
