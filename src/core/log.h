/* Logging: BRAID_LOG level, BRAID_LOG_SUBSYS filter, BRAID_LOG_FILE target.
   Lines: "<time> <host>:<pid> [<rank>] <subsys> <LEVEL> <message>". */
#ifndef BRAID_LOG_H
#define BRAID_LOG_H

#include <stdarg.h>

typedef enum braid__log_level {
  BRAID_LOG_NONE = 0,
  BRAID_LOG_ERROR,
  BRAID_LOG_WARN,
  BRAID_LOG_INFO,
  BRAID_LOG_DEBUG,
  BRAID_LOG_TRACE
} braid__log_level;

/* Subsystems, a bit each, so BRAID_LOG_SUBSYS=init,coll can select several. */
typedef enum braid__log_subsys {
  BRAID_SUB_INIT = 1 << 0,
  BRAID_SUB_COLL = 1 << 1,
  BRAID_SUB_P2P = 1 << 2,
  BRAID_SUB_SHM = 1 << 3,
  BRAID_SUB_TCP = 1 << 4,
  BRAID_SUB_BOOT = 1 << 5,
  BRAID_SUB_ENV = 1 << 6,
  BRAID_SUB_ALL = 0x7f
} braid__log_subsys;

/* Cheap check made before any formatting. */
int braid__log_enabled(braid__log_level lvl, braid__log_subsys sub);
void braid__log_write(braid__log_level lvl, braid__log_subsys sub, int rank, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void braid__log_vwrite(braid__log_level lvl, braid__log_subsys sub, int rank, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
/* Re-reads BRAID_LOG / BRAID_LOG_SUBSYS / BRAID_LOG_FILE (tests change them). */
void braid__log_reload(void);

#define BRAID_LOG(lvl, sub, rank, ...)                                          \
  do {                                                                          \
    if (braid__log_enabled((lvl), (sub))) braid__log_write((lvl), (sub), (rank), __VA_ARGS__); \
  } while (0)
#define BLOG_ERROR(sub, rank, ...) BRAID_LOG(BRAID_LOG_ERROR, sub, rank, __VA_ARGS__)
#define BLOG_WARN(sub, rank, ...) BRAID_LOG(BRAID_LOG_WARN, sub, rank, __VA_ARGS__)
#define BLOG_INFO(sub, rank, ...) BRAID_LOG(BRAID_LOG_INFO, sub, rank, __VA_ARGS__)
#define BLOG_DEBUG(sub, rank, ...) BRAID_LOG(BRAID_LOG_DEBUG, sub, rank, __VA_ARGS__)
#define BLOG_TRACE(sub, rank, ...) BRAID_LOG(BRAID_LOG_TRACE, sub, rank, __VA_ARGS__)

#endif
