// Package memtrim gives back to the kernel the memory the agent's start used and its steady
// state does not: the pages of its own executable that only the packages' init functions
// and the boot ran or read (code, read-only data, the function table), and the Go heap's
// idle pages.
//
// Why it is needed: a Go binary's init touches code and data all over the executable, and
// the kernel maps 64 KiB around each page it faults in (fault-around) and reads ahead around
// it from the file, so that after its start the agent has most of its 30 MiB executable
// resident, and charged to its cgroup, though its steady state runs a few MiB of it.
// Executable pages the agent keeps mapped are the last the kernel reclaims under pressure.
//
// A trim advises the kernel, on each read-only mapping of the executable, MADV_RANDOM (a
// page faulted in again is read alone, without its neighbours) and MADV_PAGEOUT (reclaim
// the pages now: they are clean, so they are dropped, not written anywhere), then drops the
// executable's pages no process maps from the page cache (POSIX_FADV_DONTNEED): what the
// agent runs after that is faulted in again, page by page, and stays; nothing else is held.
// Reading a page back costs one read of the flash (no write: flash wear is not affected).
//
// Run trims once the boot has settled, then again only when the executable's resident pages
// have grown by Growth past what the steady state faulted back in during the MinInterval
// after the last trim (new code paths: an exec, a burst of pods), at most every
// MinInterval: a quiet steady state is never trimmed twice.
package memtrim

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Config configures Run.
type Config struct {
	// After is how long after Run starts the first trim is: the boot's pods started. Zero
	// disables trimming.
	After time.Duration
	// Period is how often the executable's resident size is read. Defaults to a minute.
	Period time.Duration
	// Growth is how much the executable's resident size must grow, past what the steady
	// state faulted back in during the MinInterval after the last trim, for another.
	// Defaults to 8 MiB.
	Growth int64
	// MinInterval is the least time between two trims. Defaults to 5 minutes; longer than
	// Period, or the steady state's pages faulted back in are counted as growth.
	MinInterval time.Duration
	// Log receives a line per trim.
	Log *slog.Logger
}

// Result is what one trim gave back.
type Result struct {
	// ExecutableBefore and ExecutableAfter are the executable's resident bytes, in this
	// process's mappings, before and right after.
	ExecutableBefore, ExecutableAfter int64
	// HeapReleased is the Go heap's memory returned to the kernel by the trim.
	HeapReleased uint64
}

// Run trims as Config says until ctx ends. A kernel without MADV_PAGEOUT (before 5.4) ends
// it, logged: nothing else depends on it.
func Run(ctx context.Context, cfg Config) error {
	if cfg.After <= 0 {
		return nil
	}
	if cfg.Period <= 0 {
		cfg.Period = time.Minute
	}
	if cfg.Growth <= 0 {
		cfg.Growth = 8 << 20
	}
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = 5 * time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	timer := time.NewTimer(cfg.After)
	defer timer.Stop()
	var last time.Time
	// settled is the executable's resident bytes the steady state faulted back in after the
	// last trim: the trim leaves only the pages it ran itself, and what the agent runs
	// faults back in over the next minutes. Growth is counted from there, not from right
	// after the trim, or a quiet steady state whose code is Growth would be trimmed (and
	// read back from the flash, page by page) every MinInterval.
	var settled int64
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		timer.Reset(cfg.Period)
		if !last.IsZero() {
			resident, err := executableResident()
			if err != nil {
				cfg.Log.Warn("memory trim: read the executable's resident size; trimming stops", "err", err)
				return nil
			}
			if time.Since(last) < cfg.MinInterval {
				settled = max(settled, resident)
				continue
			}
			if resident-settled < cfg.Growth {
				continue
			}
		}
		res, err := trim()
		if errors.Is(err, unix.EINVAL) {
			cfg.Log.Warn("memory trim: this kernel has no MADV_PAGEOUT (Linux 5.4 and later); trimming stops", "err", err)
			return nil
		}
		if err != nil {
			cfg.Log.Warn("memory trim failed; trimming stops", "err", err)
			return nil
		}
		last, settled = time.Now(), res.ExecutableAfter
		cfg.Log.Info("memory trimmed: the executable's pages only the start used, and the heap's idle pages, given back to the kernel",
			"executableResidentBefore", res.ExecutableBefore, "executableResidentAfter", res.ExecutableAfter, "heapReleased", res.HeapReleased)
	}
}

// trim and executableResident are Trim and ExecutableResident; tests replace them.
var (
	trim               = Trim
	executableResident = ExecutableResident
)

// Trim gives back the executable's pages and the heap's idle pages now (see the package
// comment).
func Trim() (Result, error) {
	maps, err := executableMappings()
	if err != nil {
		return Result{}, err
	}
	var res Result
	for _, m := range maps {
		res.ExecutableBefore += m.resident
		if m.writable {
			continue // the data segment: written by init, anonymous once written
		}
		length := m.end - m.start
		if err := madvise(m.start, length, unix.MADV_RANDOM); err != nil {
			return res, fmt.Errorf("madvise MADV_RANDOM on %#x-%#x: %w", m.start, m.end, err)
		}
		if err := madvise(m.start, length, unix.MADV_PAGEOUT); err != nil {
			// A kernel without MADV_PAGEOUT (before 5.4) gives nothing back: the mapping
			// must not stay MADV_RANDOM, which would turn off readahead for every later
			// fault of the agent's code.
			if err2 := madvise(m.start, length, unix.MADV_NORMAL); err2 != nil {
				err = errors.Join(err, fmt.Errorf("madvise MADV_NORMAL: %w", err2))
			}
			return res, fmt.Errorf("madvise MADV_PAGEOUT on %#x-%#x: %w", m.start, m.end, err)
		}
	}
	if err := dropCache("/proc/self/exe"); err != nil {
		return res, fmt.Errorf("the executable: %w", err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	debug.FreeOSMemory()
	runtime.ReadMemStats(&after)
	if after.HeapReleased > before.HeapReleased {
		res.HeapReleased = after.HeapReleased - before.HeapReleased
	}
	if res.ExecutableAfter, err = ExecutableResident(); err != nil {
		return res, err
	}
	return res, nil
}

// ExecutableResident is the executable's resident bytes in this process's mappings.
func ExecutableResident() (int64, error) {
	maps, err := executableMappings()
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, m := range maps {
		sum += m.resident
	}
	return sum, nil
}

// executableMappings are this process's mappings of its executable, from its smaps.
func executableMappings() ([]mapping, error) {
	exe, err := executable()
	if err != nil {
		return nil, err
	}
	return readMappings("/proc/self/smaps", exe)
}

// fileID is a file by device and inode, as /proc/PID/maps names a mapping's file: the
// executable is found by it even when its path was replaced by an upgrade.
type fileID struct {
	major, minor uint32
	inode        uint64
}

func executable() (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return fileID{}, fmt.Errorf("stat /proc/self/exe: %w", err)
	}
	return fileID{major: unix.Major(st.Dev), minor: unix.Minor(st.Dev), inode: st.Ino}, nil
}

// mapping is one mapping of the executable.
type mapping struct {
	start, end uintptr
	writable   bool
	resident   int64 // bytes
}

// readMappings reads the mappings of file in an smaps file.
func readMappings(path string, file fileID) ([]mapping, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	maps, err := parseSmaps(b, file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(maps) == 0 {
		// On an overlay file system, say, the mappings name the underlying file, which
		// /proc/self/exe does not.
		return nil, fmt.Errorf("%s: no mapping of the executable (device %d:%d, inode %d)", path, file.major, file.minor, file.inode)
	}
	return maps, nil
}

// parseSmaps returns the mappings of file in smaps (the format of /proc/PID/smaps).
func parseSmaps(smaps []byte, file fileID) ([]mapping, error) {
	var out []mapping
	var cur *mapping
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			cur = nil
			m, id, err := parseMapsLine(fields)
			if err != nil {
				return nil, err
			}
			if id == file {
				out = append(out, m)
				cur = &out[len(out)-1]
			}
			continue
		}
		if cur != nil && len(fields) >= 2 && fields[0] == "Rss:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("Rss line %q: %w", line, err)
			}
			cur.resident = kb << 10
		}
	}
	return out, sc.Err()
}

// parseMapsLine parses "start-end perms offset major:minor inode [path]".
func parseMapsLine(fields []string) (mapping, fileID, error) {
	lo, hi, ok := strings.Cut(fields[0], "-")
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	major, minor, ok2 := strings.Cut(fields[3], ":")
	maj, err3 := strconv.ParseUint(major, 16, 32)
	mnr, err4 := strconv.ParseUint(minor, 16, 32)
	inode, err5 := strconv.ParseUint(fields[4], 10, 64)
	if err := errors.Join(err1, err2, err3, err4, err5); !ok || !ok2 || err != nil {
		return mapping{}, fileID{}, fmt.Errorf("mapping line %q: %v", strings.Join(fields, " "), err)
	}
	m := mapping{start: uintptr(start), end: uintptr(end), writable: strings.Contains(fields[1], "w")}
	return m, fileID{major: uint32(maj), minor: uint32(mnr), inode: inode}, nil
}

// madvise is sysMadvise; tests replace it.
var madvise = sysMadvise

func sysMadvise(start, length uintptr, advice int) error {
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, start, length, uintptr(advice)); errno != 0 {
		return errno
	}
	return nil
}

// dropCache drops the file's pages no process maps from the page cache. After the
// MADV_PAGEOUT of its mappings the executable may still have pages cached that no mapping
// had in its page tables (read ahead around a fault, on a file system without large folios):
// they would be mapped again around the next fault without being used.
func dropCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("fadvise POSIX_FADV_DONTNEED on %s: %w", path, err)
	}
	return nil
}
