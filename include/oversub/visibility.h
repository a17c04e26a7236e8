/* visibility.h - export macro for liboversub's public symbols */
#ifndef OVERSUB_VISIBILITY_H
#define OVERSUB_VISIBILITY_H

#if defined(__GNUC__)
#define OSUB_API __attribute__((visibility("default")))
#define OSUB_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define OSUB_API
#define OSUB_PRINTF(f, a)
#endif

#endif
