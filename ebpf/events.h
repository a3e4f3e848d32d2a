/* SPDX-License-Identifier: GPL-2.0-only */
/* Layout shared by the eBPF programs and the agent (agent/src/probes/abi.rs
 * mirrors every struct with size/offset assertions so they cannot drift). */
#ifndef INGERO_EVENTS_H
#define INGERO_EVENTS_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

/* Latency histogram: the log-linear scheme of proto/src/hist.rs. */
#define INGERO_HIST_BUCKETS 252

/* Cookie of a call probe: op id in the low 16 bits, flags above. */
#define COOKIE_OP_MASK 0xffffu
#define COOKIE_TIMED (1u << 16)      /* entry stores a start time for the return probe */
#define COOKIE_COMM_INIT (1u << 17)  /* ncclCommInitRank: report rank and nranks */
#define COOKIE_BRACKET (1u << 18)    /* a runtime launch that may call the driver: entry-only,
                                      * it marks the thread as inside it while its frame lives */
#define COOKIE_RT_CALLEE (1u << 19)  /* a driver call that an entry-only runtime call makes */
#define COOKIE_STATIC_RT (1u << 20)  /* a runtime linked into another file (the executable,
                                      * NCCL): its code mapping is not the runtime's alone */
#define COOKIE_DUTY (1u << 21)       /* duty-cycled (agent/src/probes/duty.rs): counted only
                                      * while the duty gate is open */

#define MAX_OPS 256
/* stall_event.op of an off-CPU episode outside any traced call (sched.bpf.c):
 * not a call, so outside the op ids. */
#define OP_OFFCPU 0xffffu
/* Its stall_event.reason: the syscall number, and a flag for a select or
 * poll that watched no file descriptor (a sleep). */
#define OFFCPU_NR_MASK 0xffffu
#define OFFCPU_NO_FDS (1u << 16)
#define OFFCPU_FEEDS (1u << 17) /* the thread has made a traced call: it feeds the GPU */
/* Op ids the compat object has a program pair for (calls.bpf.c). */
#define COMPAT_OPS 100

struct call_key {
	__u32 tgid;
	__u32 op;
};

struct call_val {
	__u64 count;
	__u64 errors;
	__u64 total_ns;
	__u64 max_ns;
	__u32 hist[INGERO_HIST_BUCKETS];
};

struct sched_val {
	__u64 on_ns;
	__u64 off_ns;
	__u64 runq_ns;
	__u64 runq_max_ns;
	__u64 voluntary;
	__u64 involuntary;
	__u64 wakeups;
	__u64 off_call_ns;  /* part of off_ns spent inside a traced CUDA/NCCL call */
	__u64 runq_call_ns; /* part of runq_ns likewise */
};

/* A process's scheduler time, split by thread: `feed`, its threads that
 * have made a traced CUDA/NCCL call (they feed the GPU); `other`, the rest
 * (watchdogs, idle pools, loader threads: asleep by design, their sleep is
 * no host stall). The compat object counts every thread in `other`. */
struct sched_vals {
	struct sched_val feed;
	struct sched_val other;
};

#define THREAD_COUNTS 4

/* Counted per half of the aggregates (`config.active` at the launch), as
 * the shared maps are: the agent reads the half it flipped away from after
 * the grace period, so a window's launches and its syncs split at the very
 * same flip, however late its read of the slots (a read preempted for a
 * third of a second after the flip put a third of a window's launches in
 * the window before: -34% in one window of CI). */
struct op_count {
	__u32 op;   /* op id + 1; 0: unused */
	__u32 n[2]; /* per half; wrap: userspace takes differences */
};

/* The outermost traced call a thread is inside (key: tid). Calls made from
 * inside it (the driver under the runtime, NCCL's launches) only deepen it:
 * they are not counted again. Userspace reads it to report calls in flight
 * (depth > 0: a return-probed call). A runtime launch is entry-only (depth
 * 0): it is still running while the return address its entry found at `sp`
 * is there, which a call made from inside it checks. */
struct thread_call {
	__u64 since_ns;
	__u32 tgid;
	__u32 op;
	__u32 depth;
	__u32 nested; /* traps of probed calls made inside traced calls (not calls of their own) */
	__u64 sp;  /* stack pointer at the outermost call's entry */
	__u64 ret; /* entry-only call: the return address at sp; 0 otherwise (compat) */
	__u64 text_lo; /* the code mapping of the runtime the thread launches through */
	__u64 text_hi;
	__u64 born; /* when the slot was made: a reused tid's slot is another thread's */
	/* Entry-only launches through the dynamic runtime, counted here by the
	 * thread itself (no shared aggregate, no atomic): cumulative for the
	 * slot's life; userspace ships the difference each window, and a slot
	 * removed at exit or exec goes to `retired` with its last counts. */
	struct op_count counts[THREAD_COUNTS];
};

/* Key of a retired thread slot (proc.bpf.c). */
struct retired_key {
	__u32 tid;
	__u32 pad;
	__u64 born;
};

struct cgroup_val {
	__u64 on_ns;
	__u64 switches;
};

struct io_key {
	__u32 tgid;
	__u32 dev;
	__u32 op;
	__u32 pad;
};

struct io_val {
	__u64 count;
	__u64 bytes;
	__u64 total_ns;
	__u64 max_ns;
	__u32 hist[INGERO_HIST_BUCKETS];
};

#define USTACK_MAX 32    /* native frames captured per outlier call */
#define PY_MAX_FRAMES 32 /* Python frames captured per outlier call (innermost) */
#define PY_NONE 0xffff   /* a py_proc offset the interpreter's version lacks */

/* Where a CPython interpreter keeps its threads and frames, per process
 * (key: tgid), written by userspace (agent/src/stacks/python.rs) when it
 * finds the interpreter: offsets per version, or _Py_DebugOffsets (3.13+). */
struct py_proc {
	__u64 runtime;      /* address of _PyRuntime in the process */
	__u16 interp_head;  /* _PyRuntime: interpreters.head */
	__u16 threads_head; /* PyInterpreterState: first thread state */
	__u16 ts_next;      /* PyThreadState: next */
	__u16 ts_thread_id; /* PyThreadState: thread_id (pthread_self) */
	__u16 ts_frame;     /* PyThreadState: frame (3.9-3.10), cframe (3.11-3.12), current_frame */
	__u16 cframe_frame; /* _PyCFrame: current_frame; PY_NONE when ts_frame is the frame */
	__u16 fr_previous;  /* frame: f_back / previous */
	__u16 fr_code;      /* frame: f_code / f_executable */
	__u16 fr_instr;     /* frame: f_lasti (int) / prev_instr / instr_ptr */
	__u16 fr_owner;     /* frame: owner (3.11+); PY_NONE before */
	__u16 instr_size;   /* 4: f_lasti is an int; 8: a pointer */
	__u16 pad;
	__u16 co_filename;  /* code object: co_filename; PY_NONE: no snapshot */
	__u16 co_name;      /* code object: co_qualname (3.11+) or co_name */
	__u16 co_linetable; /* code object: co_linetable (co_lnotab in 3.9) */
	__u16 str_ascii;    /* sizeof(PyASCIIObject): an ASCII str's text follows */
	__u16 str_compact;  /* sizeof(PyCompactUnicodeObject): other strs' text follows */
	__u16 pad2[3];
};

/* One Python frame as captured: resolved to file, function and line by
 * userspace, which reads the code object while the process lives. */
struct py_frame {
	__u64 code;  /* PyCodeObject * */
	__u64 instr; /* f_lasti, or the instruction pointer (3.11+) */
};

/* The innermost Python frame's code object as it was at the event: the
 * bytes a resolution reads (the code object's head, its type's name, its
 * file and function strs, its line table), each with its address. A
 * process whose slow call is its last statement exits, and a module's code
 * object is freed, within microseconds of the call: its frames are read
 * here, not later from a memory that is gone. Regions in the order below;
 * the line table is last, so a record ends with what it holds. */
#define PY_SNAP_REGIONS 6
#define PY_SNAP_CODE 256   /* the code object's head */
#define PY_SNAP_CODE_MIN 160 /* or this much, near a mapping's end: every offset read is below */
#define PY_SNAP_STR 256    /* a str: its header and text */
#define PY_SNAP_TABLE 4096 /* the line table's bytes object: header and table */
#define PY_SNAP_TYPE 0     /* region: the code object's type's tp_name pointer */
#define PY_SNAP_TYPENAME 1 /* region: the start of that name ("code") */
#define PY_SNAP_HEAD 2
#define PY_SNAP_FILE 3
#define PY_SNAP_NAME 4
#define PY_SNAP_LINES 5
struct py_snap {
	__u64 addr[PY_SNAP_REGIONS]; /* where each region was read; 0: not read */
	__u32 len[PY_SNAP_REGIONS];  /* bytes read into it */
	__u8 type_ptr[8];
	__u8 type_name[8];
	__u8 head[PY_SNAP_CODE];
	__u8 file[PY_SNAP_STR];
	__u8 name[PY_SNAP_STR];
	__u8 lines[PY_SNAP_TABLE];
};

/* One outlier call, sent through the stalls ring buffer, with where it was
 * made: the native user stack at the call's return and, for a CPython
 * thread, its Python frames (innermost first). */
struct stall_event {
	__u64 ts_ns;
	__u64 duration_ns;
	__u64 threshold_ns;
	__u64 cgroup_id;
	__u32 tgid;
	__u32 tid;
	__u32 op;
	__u32 reason; /* OP_OFFCPU: the syscall the thread slept in, | OFFCPU_NO_FDS; otherwise 0 */
	__s32 ustack_bytes; /* bytes of ustack filled; negative: none (error) */
	__u32 py_frames;    /* Python frames in py; 0: not a Python thread */
	__u64 ustack[USTACK_MAX];
	struct py_frame py[PY_MAX_FRAMES];
};

/* What the stall rings carry: the event, then (for a CPython thread) the
 * snapshot of its innermost frame's code object, up to the line table's
 * last byte read; the record is cut after `e` when there is none. */
struct stall_record {
	struct stall_event e;
	struct py_snap snap;
};

#define PROC_EXEC 1
#define PROC_EXIT 2
#define PROC_FORK 3
#define PROC_OOM 4
#define PROC_COMM_INIT 5
#define PROC_DLOPEN 6 /* a CUDA/NCCL library not yet probed is looked up; the thread waits (other: tid) */
#define PROC_LIB_LOOKUP 7 /* a process's first lookup in a CUDA/NCCL library, where nothing can wait (other: tid) */

/* Process lifecycle and rare events, through the procs ring buffer. */
struct proc_event {
	__u64 ts_ns;
	__u64 cgroup_id;
	__u32 kind;
	__u32 tgid;
	__u32 other; /* fork: child tgid; comm init: rank */
	__s32 value; /* exit: code; oom: -; comm init: nranks */
	__u64 extra; /* comm init: first 8 bytes of the NCCL unique id */
	char comm[16];
};

/* Loss and activity counters, one per CPU. */
struct counters {
	__u64 events;
	__u64 ringbuf_drops;
	__u64 map_full;
	__u64 inflight_full;
	__u64 lib_holds;         /* threads held at a new library's first lookup */
	__u64 lib_hold_ns;       /* time they were held */
	__u64 lib_hold_timeouts; /* holds that ran out (HOLD_MAX_NS) before the agent released them */
	__u64 mark_drops;        /* step marks lost to a full marks ring (not events: counted apart) */
	__u64 sched_missed;      /* switches of tracked threads no program saw (the kernel skipped
	                          * them): each can lose one off-CPU episode */
	__u64 py_faults;         /* Python call sites cut short: a read of the interpreter's memory
	                          * failed (a page not resident: these probes cannot fault) */
};

/* Written by userspace. */
struct config {
	__u32 active;       /* which of the A/B aggregation maps the programs fill */
	__u32 scoped;       /* 1: only tasks under the cgroup in scope_cgroup[0] */
	__u32 track_all;    /* 1: scheduler stats for every process (tests, --pid) */
	__u32 pid_filter;   /* 1: calls only from processes in the targets map (--pid) */
	__u32 pidns_level;  /* depth of the agent's pid namespace + 1; 0 until the
	                     * programs find it (written by them, once) */
	__u32 hold_dlopen;  /* 1: hold a thread that dlopens a CUDA/NCCL library until probed */
	__u64 pidns_ino;    /* inode of the agent's pid namespace (/proc/self/ns/pid);
	                     * 0: the initial namespace, pids need no translation */
	__u64 scope_cgroup_id; /* scoped: the cgroup id of the subtree's root ... */
	__u32 scope_level;     /* ... and its depth below the hierarchy's root */
	__u32 hold_max_ms;     /* longest hold at a library lookup; 0: 1000 */
	__u32 offcpu_site_us;  /* off-CPU episodes outside calls this long ship their site; 0: none */
	__u32 call_marks;      /* 1: every return-probed call's return goes to the marks ring */
};

/* One return-probed call (a sync, copy, collective, allocation) as it
 * returned, through the marks ring: the agent finds each process's step
 * cycle in their sequence (agent/src/steps). Launches make none. */
struct call_mark {
	__u64 ts_ns; /* the return */
	__u64 dur_ns;
	__u32 tgid;
	__u32 tid;
	__u32 op;
	__u32 flags; /* MARK_DUTY_ON, MARK_HALF_B */
};

/* call_mark.flags: the duty gate (calls.bpf.c) was open at the return, so
 * the launches of the step this call ended were counted. The agent learns
 * a sampled loop's pace from these marks; its own clock reads around the
 * gate's writes can be late by a preemption (seen: estimates -49% with a
 * 150-ms delay after a write). */
#define MARK_DUTY_ON 1u
/* call_mark.flags: the call returned while the aggregates' active half was
 * b (`config.active`): the window its sync was counted in, which the
 * agent's clock read at the flip can only approximate. */
#define MARK_HALF_B 2u

#endif
