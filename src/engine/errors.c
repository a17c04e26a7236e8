/* errors.c - messages and API codes of the project's error codes */
#include "oversub/errors.h"

const char *osub_strerror(int rc)
{
    switch (rc) {
    case OSUB_OK:
        return "ok";
#define OSUB__ERR_MSG(name, value, code, msg)                                                      \
    case OSUB_E##name:                                                                             \
        return msg;
        OSUB_ERRNO_MAP(OSUB__ERR_MSG)
#undef OSUB__ERR_MSG
    default:
        return "unknown error";
    }
}

const char *osub_errcode(int rc)
{
    switch (rc) {
    case OSUB_OK:
        return "ok";
#define OSUB__ERR_CODE(name, value, code, msg)                                                     \
    case OSUB_E##name:                                                                             \
        return code;
        OSUB_ERRNO_MAP(OSUB__ERR_CODE)
#undef OSUB__ERR_CODE
    default:
        return "unknown";
    }
}
