package config

import (
	"os"
	"reflect"
	"strings"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	"github.com/holdfast-dev/holdfast/test/hostile"
)

// aliasBomb is a configuration file that is CVE-2019-11253's billion laughs.
var aliasBomb = hostile.YAMLAliasBomb("nodeName: bomb\n")

// FuzzParse feeds configuration files to Parse. It returns either a valid configuration or an
// error, never both; and what it accepts means the same once written out: the YAML of a loaded
// configuration loads to an equal configuration (defaults are a fixed point).
func FuzzParse(f *testing.F) {
	fw, err := os.ReadFile("../../firmware/config.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(fw)
	f.Add([]byte(""))
	f.Add([]byte("nodeName: gw-1\nnodeStatus:\n  leaseRenewInterval: 2s\n"))
	f.Add([]byte("nodeName: gw-1\nkubeconfig: /etc/holdfast/kubeconfig\nbootstrapKubeconfig: /etc/holdfast/bootstrap-kubeconfig\n" +
		"manifestDir: \"-\"\nimagePreloadDir: \"-\"\nhealthzAddress: \"-\"\nlocalAPISocket: \"-\"\nport: 0\n" +
		"clusterDNS: [10.96.0.10, \"fd00::a\"]\nallowedUnsafeSysctls: [net.core.somaxconn, kernel.msg*]\n" +
		"evictionHard: {memory.available: 200Mi, nodefs.available: \"0%\"}\n" +
		"evictionSoft: {memory.available: 300Mi}\nevictionSoftGracePeriod: {memory.available: 1m30s}\n" +
		"systemReserved: {cpu: 100m, memory: 64Mi, pid: \"100\"}\nkubeReserved: {ephemeral-storage: 1Gi}\n" +
		"gc: {imageHighThresholdPercent: 100, imageLowThresholdPercent: 99, pinnedImages: [busybox]}\n"))
	f.Add([]byte(`{"nodeName":"gw-1","maxPods":1,"pods":{"relistPeriod":"500ms","relistThreshold":"1s"}}`))
	f.Add([]byte(aliasBomb))
	f.Add([]byte("maxPods: 99999999999999999999999\n"))
	f.Add([]byte("port: -9223372036854775808\n"))
	f.Add([]byte("nodeStatus:\n  leaseDuration: 9223372036854775807ns\n"))
	f.Add([]byte("nodeName: \xff\xfe\nclusterDomain: \xc0\xaf\n"))
	f.Add([]byte("cni:\n  binDirs: " + strings.Repeat("[", 3000) + strings.Repeat("]", 3000) + "\n"))
	f.Add(fw[:len(fw)/3])

	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b, nil)
		if err != nil {
			if !reflect.DeepEqual(c, Config{}) {
				t.Fatalf("Parse returned an error and a configuration: %v\n%+v", err, c)
			}
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("Parse returned an error without a message")
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a configuration Validate refuses: %v", err)
		}
		// "-" is how a file disables these; defaulting turns it into "". Written out, a
		// disabled field must say "-" again, or it would read back as its default.
		out := c
		for _, s := range []*string{&out.ManifestDir, &out.ImagePreloadDir, &out.HealthzAddress, &out.LocalAPISocket} {
			if *s == "" {
				*s = "-"
			}
		}
		y, err := yaml.Marshal(out)
		if err != nil {
			t.Fatalf("encode an accepted configuration: %v", err)
		}
		again, err := Parse(y, nil)
		if err != nil {
			t.Fatalf("an accepted configuration written out does not load: %v\n%s", err, y)
		}
		// Semantically: an empty list or map is written as none (omitempty) and reads back as
		// none, which means the same.
		if !apiequality.Semantic.DeepEqual(again, c) {
			t.Fatalf("an accepted configuration written out loads differently:\n%s\n got %+v\nwant %+v", y, again, c)
		}
	})
}

// A hostile file is refused: an alias bomb (the YAML decoder bounds alias expansion; without
// the bound this test would not end), and a file over MaxFileBytes whatever it holds.
func TestParseRefusesHostileFiles(t *testing.T) {
	if _, err := Parse([]byte(aliasBomb), nil); err == nil {
		t.Error("the alias bomb parsed")
	}
	huge := []byte("nodeName: gw-1\n" + strings.Repeat("#", MaxFileBytes))
	if _, err := Parse(huge, nil); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("a %d-byte file: err = %v, want the size limit", len(huge), err)
	}
	p := t.TempDir() + "/config.yaml"
	if err := os.WriteFile(p, huge, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "limit") {
		t.Errorf("Load of a %d-byte file: err = %v, want the size limit and the path", len(huge), err)
	}
}
