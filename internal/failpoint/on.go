//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Enabled says whether this binary was built with -tags failpoints.
const Enabled = true

// armed is the point named by HOLDFAST_FAILPOINT, read once.
var armed = sync.OnceValue(func() *arm {
	v := os.Getenv(EnvPoint)
	if v == "" {
		return nil
	}
	name, nth, _ := strings.Cut(v, "@")
	a := &arm{name: name, nth: 1, marker: os.Getenv(EnvMarker)}
	if nth != "" {
		n, err := strconv.ParseInt(nth, 10, 64)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "failpoint: %s=%q: the crossing after @ must be a positive number\n", EnvPoint, v)
			os.Exit(2)
		}
		a.nth = n
	}
	return a
})

// arm is the armed point: stop at its nth crossing.
type arm struct {
	name   string
	nth    int64
	marker string
	hits   atomic.Int64
}

// Inject stops the process dead if name is the armed point and this is its nth crossing.
func Inject(name string) {
	a := armed()
	if a == nil || a.name != name || a.hits.Add(1) != a.nth {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint %s reached (crossing %d): stopping the process\n", name, a.nth)
	if a.marker != "" {
		if err := writeMarker(a.marker, name); err != nil {
			fmt.Fprintf(os.Stderr, "failpoint %s: marker: %v\n", name, err)
		}
	}
	// The whole process stops here, every goroutine with it; only SIGKILL (or SIGCONT) ends it.
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	// Resumed by SIGCONT instead of killed: this goroutine stays stopped at the point.
	select {}
}

func writeMarker(path, name string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(name + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
