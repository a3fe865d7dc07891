// Allocates N small records, keeps every tenth, collects, says "ready", waits MS
// milliseconds and then for its standard input to close: a Java heap whose survivors are
// spread over every region the records filled. With "humongous", it also keeps 16 arrays
// of 2.2 MiB, which G1 with regions of 1 MiB places in regions of their own.
// Usage: KeepTenth [N [plain|humongous [MS]]]
import java.io.InputStream;
import java.util.ArrayList;

public class KeepTenth {
    static final class Record {
        final long a;
        final long b;
        final byte[] payload;

        Record(int i) {
            a = i;
            b = i * 3L;
            payload = new byte[24];
        }
    }

    public static void main(String[] args) throws Exception {
        int n = args.length > 0 ? Integer.parseInt(args[0]) : 2_000_000;
        boolean humongous = args.length > 1 && args[1].equals("humongous");
        ArrayList<Record> all = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            all.add(new Record(i));
        }
        ArrayList<Record> kept = new ArrayList<>();
        for (int i = 0; i < n; i += 10) {
            kept.add(all.get(i));
        }
        all = null;
        ArrayList<long[]> big = new ArrayList<>();
        if (humongous) {
            for (int i = 0; i < 16; i++) {
                big.add(new long[(int) (2.2 * (1 << 20) / 8)]);
            }
        }
        System.gc();
        System.out.println("ready " + ProcessHandle.current().pid() + " kept " + kept.size()
                + " humongous " + big.size());
        System.out.flush();
        Thread.sleep(args.length > 2 ? Long.parseLong(args[2]) : 0);
        InputStream in = System.in;
        while (in.read() >= 0) {
        }
        System.out.println(kept.get(kept.size() - 1).a + big.size());
    }
}
