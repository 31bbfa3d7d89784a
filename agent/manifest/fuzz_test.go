package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	"github.com/holdfast-dev/holdfast/test/hostile"
)

// aliasBomb is a Pod manifest that is CVE-2019-11253's billion laughs.
var aliasBomb = hostile.YAMLAliasBomb("apiVersion: v1\nkind: Pod\nmetadata: {name: bomb}\n")

// FuzzDecode feeds manifest files to what the file source does with them: Decode, then
// MakeStatic (defaults and validation). What it accepts must survive being written out and
// read back: the canonical YAML of an accepted pod decodes (strictly) to the same pod, which
// validates again, and the same bytes always give the same static identity.
// testdata/fuzz/FuzzDecode holds the input of the bug it caught (a timestamp that does not
// read back).
func FuzzDecode(f *testing.F) {
	f.Add([]byte(twoContainers))
	for _, name := range []string{"web.yaml", "uplink-monitor.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "firmware", "manifests", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j","namespace":"edge"},` +
		`"spec":{"restartPolicy":"OnFailure","terminationGracePeriodSeconds":0,` +
		`"initContainers":[{"name":"init","image":"busybox@sha256:` + strings.Repeat("a", 64) + `"}],` +
		`"containers":[{"name":"c","image":"r.local:5000/app:1","ports":[{"containerPort":80}],` +
		`"resources":{"limits":{"cpu":"500m","memory":"64Mi"}}}]}}`))
	f.Add([]byte(aliasBomb))
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: x, ports: [{containerPort: 99999999999999999999}]}]}\n"))
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: {k: \xff\xfe}}\nspec: {containers: [{name: c, image: x}]}\n"))
	f.Add([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: x, args: " +
		strings.Repeat("[", 2000) + strings.Repeat("]", 2000) + "}]}\n"))
	f.Add([]byte(twoContainers[:len(twoContainers)/2]))
	f.Add([]byte("apiVersion: v1\nkind: Pod\nspec:\n  terminationGracePeriodSeconds: -9223372036854775808\n"))

	f.Fuzz(func(t *testing.T, data []byte) {
		pod, err := Decode(data)
		if len(data) > MaxSize && err == nil {
			t.Fatalf("a %d-byte manifest was decoded, over MaxSize", len(data))
		}
		if err != nil {
			return
		}
		again, err := Decode(data)
		if err != nil {
			t.Fatalf("second decode of the same bytes failed: %v", err)
		}
		const node, src = "gw-1", "/etc/holdfast/manifests/m.yaml"
		if err := MakeStatic(pod, node, src); err != nil {
			if err2 := MakeStatic(again, node, src); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("MakeStatic is not deterministic: %v, then %v", err, err2)
			}
			return
		}
		if err := MakeStatic(again, node, src); err != nil || again.UID != pod.UID {
			t.Fatalf("same bytes, different static pod: UID %q then %q (%v)", pod.UID, again.UID, err)
		}
		out, err := yaml.Marshal(pod)
		if err != nil {
			t.Fatalf("encode an accepted pod: %v", err)
		}
		back, err := Decode(out)
		if err != nil {
			t.Fatalf("an accepted pod does not decode once written out: %v\n%s", err, out)
		}
		if err := Validate(back); err != nil {
			t.Fatalf("an accepted pod written out and read back no longer validates: %v\n%s", err, out)
		}
		if !apiequality.Semantic.DeepEqual(pod, back) {
			t.Fatalf("round trip changed the pod:\n%s\nread back as\n%s", out, mustYAML(t, back))
		}
	})
}

func mustYAML(t *testing.T, v any) []byte {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A YAML alias bomb is refused: the decoder bounds alias expansion (without the bound this
// test would not end).
func TestDecodeYAMLBomb(t *testing.T) {
	if _, err := Decode([]byte(aliasBomb)); err == nil {
		t.Fatal("the alias bomb decoded")
	}
}
