/* One list of every status: generates the string table (keep in enum order). */
#define BRAID_STATUS_LIST(X)                                                  \
  X(BRAID_OK, "success")                                                      \
  X(BRAID_ERR_INVALID_ARG, "invalid argument")                                \
  X(BRAID_ERR_UNSUPPORTED, "unsupported operation")                           \
  X(BRAID_ERR_NO_MEMORY, "out of memory")                                     \
  X(BRAID_ERR_TIMEOUT, "timed out")                                           \
  X(BRAID_ERR_PEER_LOST, "peer lost")                                         \
  X(BRAID_ERR_ABORTED, "communicator aborted")                                \
  X(BRAID_ERR_MISMATCH, "message size or type mismatch")                      \
  X(BRAID_ERR_BOOTSTRAP, "bootstrap failed")                                  \
  X(BRAID_ERR_SYSTEM, "system call failed")                                   \
  X(BRAID_ERR_BACKEND, "backend library error")                               \
  X(BRAID_ERR_INTERNAL, "internal error")
