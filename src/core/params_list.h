/*
 * Every environment parameter braid reads, one row each:
 *
 *   X(ID, "BRAID_NAME", TYPE, "default text" or NULL, "one-line doc")
 *
 * TYPE is STRING, INT, SECONDS or SIZE. The default is written here and
 * nowhere else: numeric accessors parse it with the parser that reads the
 * variable (core/params.h), braid-info prints it, and docs/ENVIRONMENT.md
 * holds the table braid-info --markdown generates from this list. NULL means
 * there is no default value (the variable is optional, or unset means an
 * automatic choice the doc describes). The name is "BRAID_" followed by ID.
 */
#ifndef BRAID_PARAMS_LIST_H
#define BRAID_PARAMS_LIST_H

#define BRAID_PARAM_LIST(X)                                                                                           \
  X(BACKEND, "BRAID_BACKEND", STRING, NULL,                                                                           \
    "backend of braid_init(NULL): self, shm, tcp, hier, mpi, nccl; unset or auto: self for one rank, mpi under mpirun "    \
    "without a store (when built), else shm when every rank is on one node, hier when they are not; the same on every " \
    "rank (compared at init)")                                                                                        \
  X(RANK, "BRAID_RANK", INT, "0", "this process's rank in the job")                                                   \
  X(WORLD_SIZE, "BRAID_WORLD_SIZE", INT, "1", "number of ranks in the job")                                           \
  X(LOCAL_RANK, "BRAID_LOCAL_RANK", INT, NULL,                                                                        \
    "this process's rank among the job's ranks on its host (set with BRAID_LOCAL_SIZE; else derived)")                \
  X(LOCAL_SIZE, "BRAID_LOCAL_SIZE", INT, NULL,                                                                        \
    "number of the job's ranks on this host (set with BRAID_LOCAL_RANK)")                                             \
  X(STORE, "BRAID_STORE", STRING, NULL,                                                                               \
    "host:port ([addr]:port for IPv6) of the rendezvous store; overrides MASTER_ADDR/MASTER_PORT")                    \
  X(STORE_EXTERNAL, "BRAID_STORE_EXTERNAL", INT, "0",                                                                 \
    "1: the store at BRAID_STORE is already running (braidrun); 0: rank 0 starts it")                                 \
  X(TOKEN, "BRAID_TOKEN", STRING, NULL,                                                                               \
    "job secret, 64 hex digits, authenticating every store connection; unset: loopback-only store")                   \
  X(JOB_ID, "BRAID_JOB_ID", STRING, NULL,                                                                             \
    "namespace of the job's store keys (default: the launcher's job id); required with BRAID_STORE_EXTERNAL=1")       \
  X(INIT_TIMEOUT, "BRAID_INIT_TIMEOUT", SECONDS, "60",                                                                \
    "seconds braid_init waits for the store and for every rank to join (0 = forever)")                                \
  X(PORT_RANGE, "BRAID_PORT_RANGE", STRING, NULL,                                                                     \
    "ports for data-plane listeners, e.g. 29500-29600 (busy ports are skipped); unset: any free port")                \
  X(IFNAME, "BRAID_IFNAME", STRING, NULL, "network interface whose address data-plane listeners use, e.g. eth0")      \
  X(ADDR, "BRAID_ADDR", STRING, NULL, "numeric address data-plane listeners bind and advertise")                      \
  X(TIMEOUT, "BRAID_TIMEOUT", SECONDS, "300",                                                                         \
    "seconds a blocking call may wait without progress before BRAID_ERR_TIMEOUT (decimals allowed; 0 = forever)")     \
  X(DESTROY_TIMEOUT, "BRAID_DESTROY_TIMEOUT", SECONDS, "5",                                                           \
    "seconds braid_destroy spends completing pending operations before abandoning them")                              \
  X(ALGO, "BRAID_ALGO", STRING, NULL,                                                                                 \
    "per-collective algorithm override, e.g. allreduce=ring,broadcast=tree; names: braid-info; every rank must set "  \
    "the same (compared at init)")                                                                                    \
  X(CHECK, "BRAID_CHECK", INT, "1",                                                                                   \
    "1 checks on every collective that all ranks made the same call (op, dtype, count, root/op) and fails with "      \
    "BRAID_ERR_MISMATCH naming both calls; 0 turns the check off; every rank must set the same (compared at init)")  \
  X(LOG, "BRAID_LOG", STRING, "warn", "log level: error, warn, info, debug, trace (or off)")                          \
  X(LOG_SUBSYS, "BRAID_LOG_SUBSYS", STRING, "all",                                                                    \
    "comma list of subsystems to log: init, coll, p2p, shm, tcp, boot, env")                                          \
  X(LOG_FILE, "BRAID_LOG_FILE", STRING, NULL, "append log lines to this file instead of stderr; %h = host, %p = pid") \
  X(NODE_ID, "BRAID_NODE_ID", STRING, NULL,                                                                           \
    "the node this rank is on, for hier and auto (unset: host name and boot id); set it to simulate nodes on one "   \
    "host")                                                                                                           \
  X(HIER_INTRA, "BRAID_HIER_INTRA", STRING, "shm",                                                                    \
    "hier backend: the backend inside a node (shm, tcp, or nccl for device memory); the same on every rank "          \
    "(compared at init)")                                                                                             \
  X(HIER_INTER, "BRAID_HIER_INTER", STRING, "tcp",                                                                    \
    "hier backend: the backend between nodes; the same on every rank (compared at init)")                            \
  X(HIER_PIECE, "BRAID_HIER_PIECE", SIZE, "4M",                                                                       \
    "hier over nccl: large between-node stages go through host memory in pieces of about this many bytes, the device " \
    "copies of one piece overlapping the network transfer of another (0: one piece; rank 0's value counts)")                                 \
  X(TRACE_FILE, "BRAID_TRACE_FILE", STRING, NULL,                                                                     \
    "flight recorder: write each communicator's last operations here as JSON lines when it fails (and on SIGUSR1); "  \
    "%h = host, %p = pid, %r = rank; unset: to the log")                                                              \
  X(TRACE_SIGNAL, "BRAID_TRACE_SIGNAL", INT, "0",                                                                     \
    "1: SIGUSR1 makes every communicator dump its flight recorder (at its next call or wait step)")                   \
  X(TRACE_DEPTH, "BRAID_TRACE_DEPTH", INT, "64", "operations each communicator's flight recorder keeps (0: off)")     \
  X(SHM_BUFFER, "BRAID_SHM_BUFFER", SIZE, "8M",                                                                       \
    "shm backend: shared staging bytes per rank (K/M/G suffix); bounds memory for large operations")                  \
  X(SHM_CMA, "BRAID_SHM_CMA", INT, "1",                                                                               \
    "shm backend: 1 uses single-copy process_vm_readv/writev when the kernel allows it, 0 copies through shared "     \
    "memory")                                                                                                         \
  X(SHM_SPLICE, "BRAID_SHM_SPLICE", INT, "1",                                                                         \
    "shm backend: without single copy, 1 moves point-to-point messages of 8 KiB-4 MiB (and the collectives built "    \
    "on them) through pipes by vmsplice, one copy; 0 streams them through shared memory, two copies")                 \
  X(SHM_CMA_MIN, "BRAID_SHM_CMA_MIN", SIZE, "256M",                                                                   \
    "shm backend: collectives of at least this many bytes use single copy (when available; messages above 8 KiB "     \
    "always do)")                                                                                                     \
  X(SHM_A2A, "BRAID_SHM_A2A", STRING, "auto",                                                                        \
    "shm backend, with single copy: how all-to-all(v) blocks above the slots move: auto (rank 0 times staged rounds " \
    "and single copy per size class, in and out of place apart, and picks the faster), staged or single (rank 0's "   \
    "value counts)")                                                                                                  \
  X(SHM_ZEROCOPY, "BRAID_SHM_ZEROCOPY", INT, "1",                                                                     \
    "shm backend: 1 lets peers read braid_mem_alloc buffers in place when the kernel allows it, 0 copies them "       \
    "like other memory")                                                                                              \
  X(SHM_MEMBARRIER, "BRAID_SHM_MEMBARRIER", INT, "1",                                                                 \
    "shm backend: 1 pairs wake-ups with membarrier when the kernel allows it (no fence per send), 0 fences both "     \
    "sides")                                                                                                          \
  X(TCP_NSOCKS, "BRAID_TCP_NSOCKS", INT, "2",                                                                         \
    "tcp backend: sockets a rank opens to each peer on another host it sends to (1-16; one to a peer on the same "    \
    "host); messages above BRAID_TCP_EAGER_MAX are striped over them")                                                \
  X(TCP_EAGER_MAX, "BRAID_TCP_EAGER_MAX", SIZE, "128K",                                                                 \
    "tcp backend: messages up to this many bytes are sent at once; larger ones wait for the receiver's go-ahead "     \
    "(at most 64M)")                                                                                                  \
  X(TCP_BUFFER, "BRAID_TCP_BUFFER", SIZE, "4M",                                                                       \
    "tcp backend: SO_SNDBUF/SO_RCVBUF requested per socket, when the system's maximum allows that much (else the "    \
    "kernel sizes them)")                                                                                             \
  X(TCP_NOTSENT, "BRAID_TCP_NOTSENT", SIZE, "256K",                                                                   \
    "tcp backend: most bytes a socket to a peer on another host holds unsent in the kernel (TCP_NOTSENT_LOWAT; 0: "   \
    "no limit), so that a go-ahead for the peer's message is not queued behind this rank's data for long")          \
  X(TCP_CONGESTION, "BRAID_TCP_CONGESTION", STRING, "auto",                                                          \
    "tcp backend: congestion control of the sockets a rank sends on: auto (to a peer on the same host, cubic or "    \
    "else reno where the system's default paces the sender, as bbr does; to other hosts the system's), system, or "  \
    "an algorithm the kernel offers for every socket")                                                               \
  X(MPI_MAX_COUNT, "BRAID_MPI_MAX_COUNT", SIZE, "2147483647",                                                         \
    "mpi backend: most bytes (and elements) one MPI call carries; larger messages and collectives go in pieces")    \
  X(MPI_COLL, "BRAID_MPI_COLL", STRING, "auto",                                                                      \
    "mpi backend: auto (braid's algorithms over MPI point to point where they measured faster, MPI's collectives "   \
    "elsewhere), native (MPI's collectives for every call) or generic (braid's algorithms for every call)")         \
  X(NCCL_LIB, "BRAID_NCCL_LIB", STRING, "libnccl.so.2", "nccl backend: the NCCL library braid opens at run time")     \
  X(CUDART_LIB, "BRAID_CUDART_LIB", STRING, "libcudart.so",                                                           \
    "nccl backend: the CUDA runtime library braid opens at run time (then libcudart.so.13, .12, .11)")                \
  X(CUDA_DEVICE, "BRAID_CUDA_DEVICE", INT, NULL,                                                                      \
    "nccl backend: the CUDA device of this rank; unset: the local rank (modulo the devices visible)")

#endif
