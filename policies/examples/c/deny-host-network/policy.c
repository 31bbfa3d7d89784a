/*
 * deny-host-network: a holdfast admission policy in C, with no libc, to show
 * that the ABI (policies/ABI.md) is not Go-only. It denies pods that set
 * spec.hostNetwork to true.
 *
 * It looks for the member "hostNetwork":true in the input. The host writes
 * the input with Go's encoding/json (compact, no spaces), and no other pod
 * field is named hostNetwork, so a byte search is exact for that input;
 * a real C policy would use a JSON parser.
 *
 * Build: clang --target=wasm32 -O2 -nostdlib -Wl,--no-entry -o policy.wasm policy.c
 */

#define EXPORT(name) __attribute__((export_name(name)))
#define IMPORT(mod, name) __attribute__((import_module(mod), import_name(name)))

IMPORT("holdfast", "log") void hf_log(int level, const char *ptr, int len);

/* A bump allocator over a static arena, reset when everything is freed. */
static unsigned char arena[256 * 1024];
static unsigned int top;
static int live;

EXPORT("holdfast_abi_version") int abi_version(void) { return 1; }

EXPORT("alloc") void *alloc(unsigned int size) {
	unsigned int start = (top + 7u) & ~7u;
	if (size > sizeof(arena) || start > sizeof(arena) - size)
		return 0;
	top = start + size;
	live++;
	return &arena[start];
}

EXPORT("free") void release(void *ptr, unsigned int size) {
	(void)size;
	if ((unsigned char *)ptr < arena || (unsigned char *)ptr >= arena + sizeof(arena))
		return; /* static output */
	if (--live <= 0) {
		live = 0;
		top = 0;
	}
}

static int contains(const char *hay, unsigned int n, const char *needle) {
	unsigned int m = 0;
	while (needle[m])
		m++;
	for (unsigned int i = 0; i + m <= n; i++) {
		unsigned int j = 0;
		while (j < m && hay[i + j] == needle[j])
			j++;
		if (j == m)
			return 1;
	}
	return 0;
}

static const char allow[] = "{\"allowed\":true}";
static const char deny[] = "{\"allowed\":false,\"reason\":\"HostNetwork\","
                           "\"message\":\"the pod uses the host's network namespace\"}";

static unsigned long long pack(const char *p, unsigned int n) {
	return ((unsigned long long)(unsigned int)p << 32) | n;
}

EXPORT("admit") unsigned long long admit(const char *input, unsigned int len) {
	if (contains(input, len, "\"hostNetwork\":true")) {
		static const char msg[] = "denying a hostNetwork pod";
		hf_log(1, msg, sizeof(msg) - 1);
		return pack(deny, sizeof(deny) - 1);
	}
	return pack(allow, sizeof(allow) - 1);
}
