-- A server's static cache, as in seed 003: a map built once, then looked up by requests
-- that allocate. `compact` puts the cache in a compact region (GHC.Compact), which the
-- collector neither traverses nor copies; `plain` leaves it in the heap, copied by every
-- major collection.
--
--   Compact ENTRIES REQUESTS plain|compact
{-# LANGUAGE BangPatterns #-}
import Control.Exception (evaluate)
import Control.Monad (foldM, when)
import qualified Data.Map.Strict as M
import GHC.Compact (compact, getCompact)
import System.Environment (getArgs)
import System.Mem (performMajorGC)

main :: IO ()
main = do
  [nStr, rStr, mode] <- getArgs
  let n = read nStr :: Int
      requests = read rStr :: Int
      built = M.fromList [(i, show i ++ "-value-" ++ show (i * 31)) | i <- [1 .. n]]
  _ <- evaluate (M.foldl' (\a s -> a + length s) 0 built)
  cache <- if mode == "compact" then getCompact <$> compact built else return built
  putStrLn ("cache: " ++ show (M.size cache) ++ " entries (" ++ mode ++ ")")
  -- Requests: a lookup and some garbage each; a major collection every 10% of them,
  -- as a long-running server sees from time to time.
  total <- foldM
    (\acc i -> do
        let v = M.findWithDefault "" ((i * 7919) `mod` n + 1) cache
            !x = length (concat (replicate 20 v))
        when (i `mod` (requests `div` 10) == 0) performMajorGC
        return $! acc + x)
    0
    [1 .. requests]
  print total
