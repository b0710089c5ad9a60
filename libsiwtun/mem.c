/* Registration of ordinary memory.
 *
 * The daemon places incoming RDMA data only into memory it can map: a memfd
 * sealed against shrinking. An application registers malloc'd, static or
 * stack memory, so the library re-backs the pages of every registered range
 * with one process-wide memfd, at file offset = virtual address: it copies
 * the pages' contents into the file, then maps the file over them
 * (MAP_SHARED|MAP_FIXED) with the same protection. The application keeps
 * its addresses and its data, and from then on the daemon's mapping and the
 * application's are the same pages: no copy in the steady state.
 *
 * Because the file offset is the address, any range is contiguous in the
 * file, regions that share pages share them in the file, and registering
 * the same buffer twice (or a range that is partly re-backed) re-backs only
 * what is not yet. Which pages are re-backed is read from /proc/self/maps at
 * each registration (a page the application unmapped and mapped again is
 * anonymous again and is re-backed again).
 *
 * The copy and the remap of a range run in one assembly routine (x86-64)
 * that makes both system calls without touching the stack, so registering
 * the caller's own stack frame is safe. Limits (doc/c-programs.md): another thread
 * writing to those pages between the copy and the remap loses its write;
 * after fork() parent and child share the pages (no copy-on-write); the
 * file's pages stay allocated after the application frees or unmaps a
 * registered range until the process exits. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sw.h"

/* The file spans the user address space of 4-level paging. */
#define SW_MEM_FILE_SIZE (1ull << 47)
#define SW_MEM_NAME "siwtun-mr"

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static int mem_fd = -1;
static ino_t mem_ino;

#if defined(__x86_64__)
/* long sw_reback(int fd, void *addr, size_t len, long prot):
 * pwrite64(fd, addr, len, addr) then, if it wrote len bytes,
 * mmap(addr, len, prot, MAP_SHARED|MAP_FIXED, fd, addr). Returns mmap's
 * result, or pwrite's when it fell short. Only registers between the two
 * calls: nothing in memory changes between the copy and the remap. */
long sw_reback(int fd, void *addr, size_t len, long prot);
__asm__(".text\n"
	".globl sw_reback\n"
	".hidden sw_reback\n"
	".type sw_reback,@function\n"
	"sw_reback:\n"
	"	mov %rcx, %r8\n"   /* prot */
	"	mov %rsi, %r10\n"  /* pos = addr */
	"	mov $18, %eax\n"   /* pwrite64 */
	"	syscall\n"
	"	cmp %rdx, %rax\n"
	"	jne 1f\n"
	"	mov %r10, %r9\n"   /* offset = addr */
	"	mov %rdi, %rax\n"  /* fd */
	"	mov %rsi, %rdi\n"  /* addr */
	"	mov %rdx, %rsi\n"  /* len */
	"	mov %r8, %rdx\n"   /* prot */
	"	mov %rax, %r8\n"   /* fd */
	"	mov $0x11, %r10d\n" /* MAP_SHARED|MAP_FIXED */
	"	mov $9, %eax\n"    /* mmap */
	"	syscall\n"
	"1:	ret\n"
	".size sw_reback, .-sw_reback\n");
#else
static long sw_reback(int fd, void *addr, size_t len, long prot)
{
	/* Not atomic with respect to the caller's stack: registering the
	 * current stack frame is unsafe on this architecture. */
	ssize_t n = pwrite(fd, addr, len, (off_t)(uintptr_t)addr);
	if (n != (ssize_t)len)
		return n < 0 ? -errno : n;
	void *p = mmap(addr, len, (int)prot, MAP_SHARED | MAP_FIXED, fd, (off_t)(uintptr_t)addr);
	return p == MAP_FAILED ? -errno : (long)(uintptr_t)p;
}
#endif

static int mem_init(void)
{
	if (mem_fd >= 0)
		return 0;
	int fd = memfd_create(SW_MEM_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return errno;
	struct stat st;
	if (ftruncate(fd, (off_t)SW_MEM_FILE_SIZE) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 || fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return e;
	}
	mem_ino = st.st_ino;
	mem_fd = fd;
	return 0;
}

struct seg {
	uintptr_t start, end, off;
	unsigned long ino;
	char perms[5];
	int ours;
};

static int read_maps(uintptr_t start, uintptr_t end, struct seg **out, int *nout)
{
	FILE *f = fopen("/proc/self/maps", "re");
	if (!f)
		return errno;
	struct seg *v = NULL;
	int n = 0, cap = 0;
	char line[4096];
	while (fgets(line, sizeof(line), f)) {
		struct seg s = {0};
		unsigned long a, b, off, ino;
		unsigned maj, min;
		char path[4096] = "";
		if (sscanf(line, "%lx-%lx %4s %lx %x:%x %lu %4095[^\n]", &a, &b, s.perms, &off, &maj, &min, &ino, path) < 7)
			continue;
		if (b <= start || a >= end)
			continue;
		s.start = a;
		s.end = b;
		s.off = off;
		s.ino = ino;
		s.ours = ino == (unsigned long)mem_ino && strstr(path, "memfd:" SW_MEM_NAME) && s.perms[3] == 's' && off == a;
		if (n == cap) {
			cap = cap ? 2 * cap : 8;
			struct seg *nv = realloc(v, sizeof(*v) * (size_t)cap);
			if (!nv) {
				free(v);
				fclose(f);
				return ENOMEM;
			}
			v = nv;
		}
		v[n++] = s;
	}
	fclose(f);
	*out = v;
	*nout = n;
	return 0;
}

int sw_mem_share(void *addr, size_t len, int *fd)
{
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)addr;
	if (len == 0 || a + len < a)
		return EINVAL;
	uintptr_t start = a & ~(uintptr_t)(pg - 1);
	uintptr_t end = (a + len + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
	if (end > SW_MEM_FILE_SIZE)
		return EINVAL;
	pthread_mutex_lock(&mem_mu);
	int err = mem_init();
	struct seg *segs = NULL;
	int n = 0;
	if (!err)
		err = read_maps(start, end, &segs, &n);
	uintptr_t cur = start;
	for (int i = 0; !err && i < n && cur < end; i++) {
		struct seg *s = &segs[i];
		if (s->start > cur) {
			err = EFAULT; /* a hole */
			break;
		}
		uintptr_t e = s->end < end ? s->end : end;
		if (!s->ours) {
			if (s->perms[0] != 'r') {
				err = EFAULT;
				break;
			}
			long prot = PROT_READ | (s->perms[1] == 'w' ? PROT_WRITE : 0) | (s->perms[2] == 'x' ? PROT_EXEC : 0);
			for (uintptr_t p = cur; p < e;) {
				size_t chunk = e - p;
				if (chunk > (1u << 30))
					chunk = 1u << 30;
				long r = sw_reback(mem_fd, (void *)p, chunk, prot);
				if (r < 0 && r > -4096) {
					err = (int)-r;
					break;
				}
				if ((uintptr_t)r != p) {
					err = ENOMEM; /* short copy: the pages stay as they were */
					break;
				}
				p += chunk;
			}
		}
		cur = e;
	}
	if (!err && cur < end)
		err = EFAULT;
	free(segs);
	pthread_mutex_unlock(&mem_mu);
	*fd = mem_fd;
	return err;
}
