package sources

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/events/record"
	"github.com/holdfast-dev/holdfast/test/poll"
	"github.com/holdfast-dev/holdfast/test/prereq"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestHostileManifestDir: what may land in a gateway's manifest directory besides manifests.
// Each bad entry is reported with its path and a reason; none hangs or stops the source, and
// the good manifest beside them runs:
//   - a symlink to a file outside the directory (the agent runs as root): never followed, its
//     content never in a log line or an event; a symlink to a manifest inside it is followed;
//   - a FIFO (opening it for reading would block until a writer came) and a device node;
//   - a file over the size limit, said with its real size;
//   - a name with a newline and invalid UTF-8, quoted where it is shown.
func TestHostileManifestDir(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "manifests")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const secret = "s3cr3t-root-password-hash"
	outside := filepath.Join(root, "shadow.yaml")
	write(outside, "apiVersion: v1\nkind: Pod\nmetadata: {name: "+secret+"}\nspec: {containers: [{name: c, image: "+secret+"}]}\n")
	write(filepath.Join(dir, "good.yaml"), fmt.Sprintf(podManifest, "good", "v1"))
	if err := os.Mkdir(filepath.Join(dir, "versions"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(dir, "versions", "linked-v2.yaml"), fmt.Sprintf(podManifest, "linked", "v2"))
	for link, target := range map[string]string{"evil.yaml": outside, "linked.yaml": "versions/linked-v2.yaml", "dotdot.yaml": "../shadow.yaml"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	prereq.NoError(t, unix.Mknod(filepath.Join(dir, "zero.yaml"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 5))), "mknod of a character device (root)")
	write(filepath.Join(dir, "huge.yaml"), strings.Repeat("# padding\n", 1100000))
	weird := filepath.Join(dir, "new\nline\xff.yaml")
	write(weird, "not: [a pod")

	logs := &testenv.SyncBuffer{}
	rec := record.NewFakeRecorder(100)
	sink := &recordingSink{pods: map[types.UID]*v1.Pod{}}
	src := &FileSource{Dir: dir, NodeName: "n1", Sink: sink, Log: slog.New(slog.NewTextHandler(logs, nil)),
		Recorder: rec, QuietPeriod: 50 * time.Millisecond, Rescan: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the source did not stop: something blocked it")
		}
	}()

	poll.Until(t, 10*time.Second, 20*time.Millisecond, "the initial scan", func() error {
		if !src.Ready() {
			return fmt.Errorf("not ready (blocked on the FIFO?)")
		}
		if n := sink.names(); len(n) != 2 || n["good-n1"] == "" || n["linked-n1"] == "" {
			return fmt.Errorf("pods %v, want good-n1 and linked-n1", n)
		}
		return nil
	})
	var events []string
	for len(rec.Events) > 0 {
		events = append(events, <-rec.Events)
	}
	all := logs.String() + strings.Join(events, "\n")
	if strings.Contains(all, secret) {
		t.Errorf("the content of a file outside the directory was echoed:\n%s", all)
	}
	for _, want := range []string{
		"evil.yaml", "dotdot.yaml", "outside the manifest directory",
		"fifo.yaml", "zero.yaml", "not a regular file",
		"huge.yaml", "11000000 bytes",
		`new\nline\xff.yaml`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	}
	for _, e := range events {
		if strings.ContainsAny(e, "\n\xff") {
			t.Errorf("an event carries the raw name: %q", e)
		}
	}
}
